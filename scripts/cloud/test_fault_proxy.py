#!/usr/bin/env python3
"""Proves each fault of fault_proxy.py against the real moto that scripts/cloud-servers.sh started.

    source DIR/env && $KILN_TEST_CLOUD_PYTHON scripts/cloud/test_fault_proxy.py

boto3 (in the cloud venv) is the client, so every answer the proxy makes up is also checked
against the EC2 API model the SDKs parse. Instances it makes carry a run-unique tag and are
terminated at the end. Ends with a line `N passed, N failed`.
"""
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
import uuid

import boto3
import botocore
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {k: os.environ.get(k) for k in ("KILN_TEST_EC2_ENDPOINT", "KILN_TEST_EC2_REGION",
                                      "KILN_TEST_EC2_ACCESS_KEY_ID", "KILN_TEST_EC2_SECRET_ACCESS_KEY")}
RUN = f"fp-{uuid.uuid4().hex[:8]}"  # the tag every instance of this run carries


def client(endpoint, secret=None):
    return boto3.client(
        "ec2", endpoint_url=endpoint, region_name=ENV["KILN_TEST_EC2_REGION"] or "us-east-1",
        aws_access_key_id=ENV["KILN_TEST_EC2_ACCESS_KEY_ID"],
        aws_secret_access_key=secret or ENV["KILN_TEST_EC2_SECRET_ACCESS_KEY"],
        config=botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"}))  # no retries


class FaultProxyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        missing = [k for k, v in ENV.items() if not v and k != "KILN_TEST_EC2_REGION"]
        if missing:
            raise SystemExit(f"test_fault_proxy: {', '.join(missing)} unset: source the env file of "
                             "scripts/cloud-servers.sh start DIR")
        cls.dir = tempfile.mkdtemp(prefix="kiln-fault-proxy.")
        port_file = os.path.join(cls.dir, "port")
        cls.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fault_proxy.py"),
                                     "--upstream", ENV["KILN_TEST_EC2_ENDPOINT"], "--port-file", port_file],
                                    stdout=subprocess.DEVNULL)
        for _ in range(100):
            if os.path.exists(port_file):
                break
            time.sleep(0.05)
        with open(port_file) as f:
            cls.url = f"http://127.0.0.1:{f.read()}"
        cls.ec2 = client(cls.url)
        subnets = cls.ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
        cls.subnet = {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}
        cls.template = cls.ec2.create_launch_template(
            LaunchTemplateName=RUN, LaunchTemplateData={"ImageId": "ami-12c6146b"})["LaunchTemplate"]["LaunchTemplateId"]

    @classmethod
    def tearDownClass(cls):
        ids = [i["InstanceId"] for r in cls.ec2.describe_instances(
            Filters=[{"Name": "tag:kiln:test-run", "Values": [RUN]}])["Reservations"] for i in r["Instances"]]
        if ids:
            cls.ec2.terminate_instances(InstanceIds=ids)
        cls.proc.terminate()
        cls.proc.wait()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def setUp(self):
        self.control("POST", "reset")

    # --- helpers ---

    def control(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}/_proxy/{path}", method=method, data=data)
        with urllib.request.urlopen(req) as resp:
            return json.load(resp)

    def fault(self, **rule):
        return self.control("POST", "faults", rule)

    def fleet(self, overrides, target, market="spot", token=None, **options):
        """CreateFleet (instant) of `target` over [(type, zone)] overrides, tagged with this run."""
        token = token or uuid.uuid4().hex
        req = dict(
            Type="instant", ClientToken=token,
            LaunchTemplateConfigs=[{
                "LaunchTemplateSpecification": {"LaunchTemplateId": self.template, "Version": "$Latest"},
                "Overrides": [{"InstanceType": t, "SubnetId": self.subnet[z]} for t, z in overrides]}],
            TargetCapacitySpecification={"TotalTargetCapacity": target, "DefaultTargetCapacityType": market},
            TagSpecifications=[{"ResourceType": "instance", "Tags": [
                {"Key": "kiln:test-run", "Value": RUN}, {"Key": "kiln:intent", "Value": token}]}])
        strategy = "price-capacity-optimized" if market == "spot" else "lowest-price"
        req["SpotOptions" if market == "spot" else "OnDemandOptions"] = dict({"AllocationStrategy": strategy}, **options)
        return self.ec2.create_fleet(**req)

    @staticmethod
    def placed(resp):
        """{(type, zone): instance count} of a CreateFleet answer."""
        out = {}
        for item in resp["Instances"]:
            key = (item["InstanceType"], item["AvailabilityZone"])
            out[key] = out.get(key, 0) + len(item["InstanceIds"])
        return out

    @staticmethod
    def errors(resp):
        return sorted((e["ErrorCode"], e["LaunchTemplateAndOverrides"]["Overrides"]["InstanceType"],
                       e["LaunchTemplateAndOverrides"]["Overrides"]["SubnetId"]) for e in resp.get("Errors", []))

    def by_tag(self, key, value):
        res = self.ec2.describe_instances(Filters=[{"Name": f"tag:{key}", "Values": [value]},
                                                   {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        return sorted(i["InstanceId"] for r in res["Reservations"] for i in r["Instances"])

    def code(self, call):
        with self.assertRaises(botocore.exceptions.ClientError) as caught:
            call()
        return caught.exception.response["Error"]["Code"], caught.exception.response["ResponseMetadata"]["HTTPStatusCode"]

    # --- forwarding ---

    def test_forwarded_requests_keep_their_signature_valid(self):
        self.ec2.describe_instances()  # moto checks the signature the client made for the proxy's host
        wrong = client(self.url, secret="wrong" + ENV["KILN_TEST_EC2_SECRET_ACCESS_KEY"])
        self.assertEqual(self.code(wrong.describe_instances)[0], "AuthFailure")
        # Control: the same well-signed request with the Host rewritten to moto's is refused, so
        # the proxy's keeping Host is what makes the first call pass.
        req = AWSRequest(method="POST", url=self.url + "/", data="Action=DescribeInstances&Version=2016-11-15",
                         headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
        SigV4Auth(Credentials(ENV["KILN_TEST_EC2_ACCESS_KEY_ID"], ENV["KILN_TEST_EC2_SECRET_ACCESS_KEY"]),
                  "ec2", ENV["KILN_TEST_EC2_REGION"] or "us-east-1").add_auth(req)
        moto = ENV["KILN_TEST_EC2_ENDPOINT"].split("//", 1)[1]
        for host, expect in ((self.url.split("//", 1)[1], 200), (moto, 401)):
            conn = http.client.HTTPConnection(moto)
            conn.putrequest("POST", "/", skip_host=True)
            for name, value in dict(req.headers, Host=host).items():
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(req.body)))
            conn.endheaders(req.body)
            self.assertEqual(conn.getresponse().status, expect, f"Host {host}")
            conn.close()
        self.assertEqual(self.control("GET", "calls")["DescribeInstances"], 2)

    # --- CreateFleet ---

    def test_fleet_goes_to_the_cheapest_offering_and_past_an_ice_one(self):
        self.control("PUT", "prices", {"spot": [
            {"instance_type": "c5.large", "zone": "us-east-1a", "price": 0.02},
            {"instance_type": "c5.large", "zone": "us-east-1b", "price": 0.03},
            {"instance_type": "m5.large", "zone": "us-east-1c", "price": 0.04}]})
        overrides = [("m5.large", "us-east-1c"), ("c5.large", "us-east-1b"), ("c5.large", "us-east-1a")]
        self.assertEqual(self.placed(self.fleet(overrides, 2)), {("c5.large", "us-east-1a"): 2})
        self.fault(action="CreateFleet", instance_type="c5.large", zone="us-east-1a",
                   error="InsufficientInstanceCapacity")
        resp = self.fleet(overrides, 2)
        self.assertEqual(self.placed(resp), {("c5.large", "us-east-1b"): 2})
        self.assertEqual(self.errors(resp), [("InsufficientInstanceCapacity", "c5.large", self.subnet["us-east-1a"])])
        self.assertIn("us-east-1a", resp["Errors"][0]["ErrorMessage"])

    def test_fleet_partial_fulfilment(self):
        self.fault(action="CreateFleet", instance_type="c5.large", zone="us-east-1a", capacity=1)
        resp = self.fleet([("c5.large", "us-east-1a")], 3)
        self.assertEqual(self.placed(resp), {("c5.large", "us-east-1a"): 1})
        self.assertEqual(self.errors(resp), [("InsufficientInstanceCapacity", "c5.large", self.subnet["us-east-1a"])])
        # The capacity is spent: the next call gets nothing there.
        self.assertEqual(self.placed(self.fleet([("c5.large", "us-east-1a")], 1)), {})

    def test_fleet_min_target_capacity_is_all_or_nothing(self):
        self.fault(action="CreateFleet", instance_type="c5.large", capacity=1)
        resp = self.fleet([("c5.large", "us-east-1a"), ("c5.large", "us-east-1b")], 3,
                          MinTargetCapacity=3, SingleAvailabilityZone=True)
        self.assertEqual(resp["Instances"], [])
        self.assertTrue(resp["Errors"])

    def test_fleet_quota_errors_per_market(self):
        self.fault(action="CreateFleet", market="on-demand", error="VcpuLimitExceeded")
        self.fault(action="CreateFleet", market="spot", error="MaxSpotInstanceCountExceeded")
        overrides = [("c5.large", "us-east-1a"), ("m5.large", "us-east-1b")]
        od = self.fleet(overrides, 1, market="on-demand")
        self.assertEqual(od["Instances"], [])
        self.assertEqual({e[0] for e in self.errors(od)}, {"VcpuLimitExceeded"})
        self.assertEqual(len(od["Errors"]), 2)
        spot = self.fleet(overrides, 1)
        self.assertEqual({e[0] for e in self.errors(spot)}, {"MaxSpotInstanceCountExceeded"})
        self.assertEqual(self.control("GET", "calls")["CreateFleet"], 2)

    def test_fleet_dropped_response_then_adoption_and_client_token_replay(self):
        token = uuid.uuid4().hex
        self.fault(action="CreateFleet", drop=True, times=1)
        with self.assertRaises((botocore.exceptions.ConnectionClosedError, botocore.exceptions.EndpointConnectionError)):
            self.fleet([("c5.large", "us-east-1a")], 1, token=token)
        made = self.by_tag("kiln:intent", token)
        self.assertEqual(len(made), 1, "the instance was made although the caller saw a reset")
        again = self.fleet([("c5.large", "us-east-1a")], 1, token=token)
        self.assertEqual([i for item in again["Instances"] for i in item["InstanceIds"]], made)
        self.assertEqual(self.by_tag("kiln:intent", token), made, "the retry launched nothing")
        self.assertEqual(self.code(lambda: self.fleet([("c5.large", "us-east-1a")], 2, token=token)),
                         ("IdempotentParameterMismatch", 400))
        outcomes = [r["outcome"] for r in self.control("GET", "requests") if r["action"] == "CreateFleet"]
        self.assertEqual(outcomes, ["dropped", "replayed", "IdempotentParameterMismatch"])

    def test_fleet_whole_call_throttled(self):
        self.fault(action="CreateFleet", error="RequestLimitExceeded", times=1)
        self.assertEqual(self.code(lambda: self.fleet([("c5.large", "us-east-1a")], 1)), ("RequestLimitExceeded", 503))
        self.assertEqual(self.placed(self.fleet([("c5.large", "us-east-1a")], 1)), {("c5.large", "us-east-1a"): 1})

    # --- other actions ---

    def test_throttling_then_recovery(self):
        self.fault(action="DescribeInstances", error="RequestLimitExceeded", times=2)
        for _ in range(2):
            self.assertEqual(self.code(self.ec2.describe_instances), ("RequestLimitExceeded", 503))
        self.ec2.describe_instances()
        self.assertEqual(self.control("GET", "calls")["DescribeInstances"], 3)

    def test_bare_503(self):
        self.fault(action="TerminateInstances", status=503, times=1)
        with self.assertRaises(botocore.exceptions.ClientError) as caught:
            self.ec2.terminate_instances(InstanceIds=["i-0123456789abcdef0"])
        self.assertEqual(caught.exception.response["ResponseMetadata"]["HTTPStatusCode"], 503)

    def test_run_instances_ice_by_type_and_zone_and_client_token(self):
        self.fault(action="RunInstances", instance_type="c5.large", zone="us-east-1a", error="InsufficientInstanceCapacity")
        run = lambda zone, token: self.ec2.run_instances(
            ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="c5.large", ClientToken=token,
            SubnetId=self.subnet[zone], TagSpecifications=[{"ResourceType": "instance", "Tags": [
                {"Key": "kiln:test-run", "Value": RUN}]}])
        self.assertEqual(self.code(lambda: run("us-east-1a", uuid.uuid4().hex)), ("InsufficientInstanceCapacity", 500))
        token = uuid.uuid4().hex
        first = run("us-east-1b", token)["Instances"][0]["InstanceId"]
        self.assertEqual(run("us-east-1b", token)["Instances"][0]["InstanceId"], first)
        # A forwarded call dropped after moto carried it out: made, but the caller sees a reset.
        self.fault(action="RunInstances", drop=True, times=1)
        before = len(self.by_tag("kiln:test-run", RUN))
        with self.assertRaises(botocore.exceptions.ConnectionClosedError):
            run("us-east-1b", uuid.uuid4().hex)
        self.assertEqual(len(self.by_tag("kiln:test-run", RUN)), before + 1)

    def test_spot_price_history_from_the_table(self):
        self.control("PUT", "prices", {"spot": [{"instance_type": "g5.xlarge", "zone": "us-east-1a", "price": 0.4123},
                                                {"instance_type": "g5.xlarge", "zone": "us-east-1b", "price": 0.5}]})
        got = self.ec2.describe_spot_price_history(InstanceTypes=["g5.xlarge"], ProductDescriptions=["Linux/UNIX"],
                                                   Filters=[{"Name": "availability-zone", "Values": ["us-east-1a"]}])
        self.assertEqual([(p["AvailabilityZone"], p["SpotPrice"]) for p in got["SpotPriceHistory"]],
                         [("us-east-1a", "0.4123")])
        wrong = client(self.url, secret="wrong" + ENV["KILN_TEST_EC2_SECRET_ACCESS_KEY"])
        self.assertEqual(self.code(wrong.describe_spot_price_history)[0], "AuthFailure")


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    failed = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
