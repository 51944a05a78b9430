#!/usr/bin/env python3
"""Regenerates kiln's shipped on-demand price table from AWS's public Price List offer files.

    scripts/prices/refresh.py aws --regions us-east-1,eu-west-1 [--out services/cloud/prices/aws.csv]
    scripts/prices/refresh.py aws --regions us-east-1 --offer-file us-east-1=index.csv   (offline)

For each region it streams `/offers/v1.0/aws/AmazonEC2/current/<region>/index.csv` from
pricing.us-east-1.amazonaws.com (hundreds of MB; read row by row, never held in memory; no
credentials needed) and keeps the rows Karpenter keeps from the Pricing API: TermType OnDemand,
unit Hrs, Tenancy Shared, Operating System Linux, Pre Installed S/W NA, CapacityStatus Used,
operation RunInstances, USD, a positive price; one row per instance type. It writes
`region,instance_type,usd_per_hour`, sorted, under a first line

    # generated <UTC date> from offer file <publication date> by scripts/prices/refresh.py

which kiln-cloud reads as the table's date (docs/provisioner.md, section 11). Run it by hand
where the internet is reachable (not in CI) and commit the output. Standard library only.
"""
import argparse
import csv
import datetime
import io
import os
import sys
import urllib.request

OFFER_URL = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.csv"
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "..", "services", "cloud", "prices", "aws.csv")
KEEP = {
    "TermType": "OnDemand",
    "Unit": "Hrs",
    "Tenancy": "Shared",
    "Operating System": "Linux",
    "Pre Installed S/W": "NA",
    "CapacityStatus": "Used",
    "Currency": "USD",
}


def offer_rows(stream):
    """(publication date, iterator of dict rows) of one offer CSV, read line by line."""
    reader = csv.reader(stream)
    published = None
    for row in reader:
        if not row:
            continue
        if row[0] == "Publication Date" and len(row) > 1:
            published = row[1]
        if row[0] == "SKU":
            header = row
            break
    else:
        raise SystemExit("refresh: no header row (SKU, ...) in the offer file")
    index = {name: i for i, name in enumerate(header)}
    missing = [name for name in list(KEEP) + ["Instance Type", "PricePerUnit", "operation"] if name not in index]
    if missing:
        raise SystemExit(f"refresh: the offer file lacks the columns {missing}")

    def rows():
        for row in reader:
            yield {name: row[i] if i < len(row) else "" for name, i in index.items()}

    return published, rows()


def region_prices(region, stream):
    """{instance type: usd per hour} of one region, and the offer's publication date."""
    published, rows = offer_rows(stream)
    prices = {}
    for row in rows:
        if any(row[name] != value for name, value in KEEP.items()):
            continue
        if row["operation"] != "RunInstances" or not row["Instance Type"]:
            continue
        try:
            price = float(row["PricePerUnit"])
        except ValueError:
            continue
        if price <= 0:
            continue
        itype = row["Instance Type"]
        if itype in prices and prices[itype] != price:
            print(f"refresh: {region} {itype}: two prices, {prices[itype]} and {price}; keeping the lower",
                  file=sys.stderr)
            price = min(price, prices[itype])
        prices[itype] = price
    return published, prices


def open_offer(region, offer_files):
    if region in offer_files:
        return open(offer_files[region], newline="", encoding="utf-8")
    url = OFFER_URL.format(region=region)
    print(f"refresh: streaming {url}", file=sys.stderr)
    response = urllib.request.urlopen(url, timeout=120)
    return io.TextIOWrapper(response, encoding="utf-8", newline="")


def aws(args):
    offer_files = dict(spec.split("=", 1) for spec in args.offer_file)
    regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    if not regions:
        raise SystemExit("refresh: name at least one region")
    table, dates = [], set()
    for region in regions:
        with open_offer(region, offer_files) as stream:
            published, prices = region_prices(region, stream)
        if not prices:
            raise SystemExit(f"refresh: no Linux on-demand price for {region}: is it a region?")
        dates.add(published or "unknown")
        table += [(region, itype, price) for itype, price in prices.items()]
        print(f"refresh: {region}: {len(prices)} instance types (offer file {published})", file=sys.stderr)
    table.sort()
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(f"# generated {today} from offer file {','.join(sorted(dates))} by scripts/prices/refresh.py\n")
        out.write("region,instance_type,usd_per_hour\n")
        for region, itype, price in table:
            out.write(f"{region},{itype},{price:g}\n")
    os.replace(tmp, args.out)
    print(f"refresh: wrote {len(table)} rows to {args.out}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cloud", required=True)
    p_aws = sub.add_parser("aws", help="EC2 on-demand prices from the Price List bulk offer files")
    p_aws.add_argument("--regions", default="us-east-1,eu-west-1")
    p_aws.add_argument("--out", default=os.path.normpath(DEFAULT_OUT))
    p_aws.add_argument("--offer-file", action="append", default=[], metavar="REGION=PATH",
                       help="read a region's offer CSV from a local file instead of downloading it")
    sub.add_parser("gce", help="not written yet: see docs/provisioner.md section 11")
    args = parser.parse_args()
    if args.cloud == "aws":
        aws(args)
    else:
        raise SystemExit("refresh: gce is designed (docs/provisioner.md section 11) but not written yet")


if __name__ == "__main__":
    main()
