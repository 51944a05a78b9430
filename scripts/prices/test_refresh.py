#!/usr/bin/env python3
"""Checks refresh.py's filter on a small offer file shaped like AWS's (the real one is not
reachable here): only Linux, shared, on-demand, used-capacity hourly rows are kept, sorted.

    python3 scripts/prices/test_refresh.py
"""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
OFFER = """"FormatVersion","v1.0"
"Disclaimer","This pricing list is for informational purposes only."
"Publication Date","2026-11-20T18:00:00Z"
"Version","20261120180000"
"OfferCode","AmazonEC2"
"SKU","OfferTermCode","RateCode","TermType","PriceDescription","EffectiveDate","StartingRange","EndingRange","Unit","PricePerUnit","Currency","Product Family","serviceCode","Location","Instance Type","Tenancy","Operating System","License Model","usageType","operation","CapacityStatus","Pre Installed S/W"
"A1","JRTCKXETXF","A1.JRTCKXETXF.6YS6EN2CT7","OnDemand","$0.085 per On Demand Linux c5.large Instance Hour","2026-11-01T00:00:00Z","0","Inf","Hrs","0.0850000000","USD","Compute Instance","AmazonEC2","US East (N. Virginia)","c5.large","Shared","Linux","No License required","BoxUsage:c5.large","RunInstances","Used","NA"
"A2","JRTCKXETXF","A2.JRTCKXETXF.6YS6EN2CT7","OnDemand","$0.17 per On Demand Windows","2026-11-01T00:00:00Z","0","Inf","Hrs","0.1700000000","USD","Compute Instance","AmazonEC2","US East (N. Virginia)","c5.large","Shared","Windows","No License required","BoxUsage:c5.large","RunInstances:0002","Used","NA"
"A3","JRTCKXETXF","A3.JRTCKXETXF.6YS6EN2CT7","OnDemand","$0.00 reservation","2026-11-01T00:00:00Z","0","Inf","Hrs","0.0000000000","USD","Compute Instance","AmazonEC2","US East (N. Virginia)","m5.large","Shared","Linux","No License required","Reservation:m5.large","RunInstances","UnusedCapacityReservation","NA"
"A4","JRTCKXETXF","A4.JRTCKXETXF.6YS6EN2CT7","OnDemand","$0.096 per On Demand Linux m5.large Instance Hour","2026-11-01T00:00:00Z","0","Inf","Hrs","0.0960000000","USD","Compute Instance","AmazonEC2","US East (N. Virginia)","m5.large","Shared","Linux","No License required","BoxUsage:m5.large","RunInstances","Used","NA"
"A5","4NA7Y494T4","A5.4NA7Y494T4.6YS6EN2CT7","Reserved","1yr","2026-11-01T00:00:00Z","0","Inf","Hrs","0.0600000000","USD","Compute Instance","AmazonEC2","US East (N. Virginia)","m5.large","Shared","Linux","No License required","BoxUsage:m5.large","RunInstances","Used","NA"
"A6","JRTCKXETXF","A6.JRTCKXETXF.6YS6EN2CT7","OnDemand","dedicated","2026-11-01T00:00:00Z","0","Inf","Hrs","0.1100000000","USD","Compute Instance","AmazonEC2","US East (N. Virginia)","m5.large","Dedicated","Linux","No License required","DedicatedUsage:m5.large","RunInstances","Used","NA"
"""


class RefreshTest(unittest.TestCase):
    def test_keeps_linux_on_demand_rows_only(self):
        with tempfile.TemporaryDirectory() as tmp:
            offer, out = os.path.join(tmp, "index.csv"), os.path.join(tmp, "aws.csv")
            with open(offer, "w") as f:
                f.write(OFFER)
            subprocess.run([sys.executable, os.path.join(HERE, "refresh.py"), "aws", "--regions", "us-east-1",
                            "--offer-file", f"us-east-1={offer}", "--out", out], check=True, capture_output=True)
            with open(out) as f:
                lines = f.read().splitlines()
        self.assertRegex(lines[0], r"^# generated \d{4}-\d{2}-\d{2} from offer file 2026-11-20T18:00:00Z by ")
        self.assertEqual(lines[1:], ["region,instance_type,usd_per_hour",
                                     "us-east-1,c5.large,0.085", "us-east-1,m5.large,0.096"])


if __name__ == "__main__":
    unittest.main()
