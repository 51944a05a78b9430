#!/usr/bin/env python3
"""A fault-injecting proxy in front of moto's EC2 Query API, driven by the tests.

moto never runs out of capacity, never hits a quota, never throttles, ignores allocation
strategies and ClientToken, and answers every spot price with 0.00001. The tests of kiln's
provisioner need all of those, so they put this proxy between the provisioner and moto:

    python fault_proxy.py --upstream $KILN_TEST_EC2_ENDPOINT [--port 0] [--port-file F]

It prints `listening http://127.0.0.1:PORT` on stdout. Credentials and region come from
KILN_TEST_EC2_{ACCESS_KEY_ID,SECRET_ACCESS_KEY,REGION} (scripts/cloud-servers.sh writes them).

What it does with an EC2 request (POST / or GET /?Action=...):
  - counts it per Action (GET /_proxy/calls) and records it (GET /_proxy/requests);
  - the first fault rule that matches (Action, instance type, zone or subnet, market) decides:
    an error in AWS's XML shape and status, a bare HTTP status, a delay, or `drop`: the request
    is carried out and the connection is then reset, so the caller never sees the answer;
  - CreateFleet is carried out by the proxy itself: it checks the SigV4 signature with the
    known secret, orders the overrides (by the price table for lowest-price strategies, by
    Priority for prioritized ones, else as sent), gives each override what its rules allow
    (an error code: none, with a per-override item in <errorSet>; `capacity: N`: N instances
    then InsufficientInstanceCapacity), honours MinTargetCapacity and SingleAvailabilityZone,
    and launches each override's share through one signed single-override CreateFleet to moto;
  - CreateFleet and RunInstances are idempotent by ClientToken, as on AWS: the same token with
    the same parameters gets the first answer again (without launching), other parameters
    IdempotentParameterMismatch;
  - DescribeSpotPriceHistory is answered from the price table once one is set (moto still
    checks the signature first);
  - everything else is forwarded byte for byte, Host header included, so the client's
    signature stays valid and moto (started with signature checks on) verifies it.

Control API (JSON), on the same port under /_proxy/:
  POST   /_proxy/faults        a rule {action, instance_type?, zone?, subnet?, market?, error?,
                               message?, status?, capacity?, times?, drop?, delay_ms?, whole?}
                               -> {"id": N}
  GET    /_proxy/faults        the rules, with what is left of `times` and `capacity`
  DELETE /_proxy/faults[/ID]   remove all rules, or one
  PUT    /_proxy/prices        {"spot": [{"instance_type", "zone", "price"}], "on_demand": {type: price}}
  GET    /_proxy/calls         {"CreateFleet": 2, ...};  POST /_proxy/reset clears calls,
                               requests, rules, prices and the ClientToken memory
  GET    /_proxy/requests      [{"action", "outcome"}] in order (the last 10,000); a CreateFleet
                               the proxy carried out also has its "params" (moto ignores some,
                               such as the overrides' Placement.GroupName: tests read them here)
  GET    /_proxy/health
Standard library only (it runs in the cloud venv, but needs nothing from it).
"""
import argparse
import datetime
import hashlib
import hmac
import http.client
import json
import math
import os
import socket
import struct
import sys
import threading
import urllib.parse
import uuid
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}

# Error code -> HTTP status and AWS's wording. AWS answers client errors with 4xx and server
# errors (capacity, throttling, internal) with 5xx; SDKs retry the 5xx ones.
ERRORS = {
    "InsufficientInstanceCapacity": (500, "We currently do not have sufficient {type} capacity in the Availability Zone you requested{in_zone}. Our system will be working on provisioning additional capacity. You can currently get {type} capacity by not specifying an Availability Zone in your request or choosing a different Availability Zone."),
    "InsufficientCapacity": (500, "There is not enough capacity to fulfill your request."),
    "VcpuLimitExceeded": (400, "You have requested more vCPU capacity than your current vCPU limit of 32 allows for the instance bucket that the specified instance type belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit."),
    "MaxSpotInstanceCountExceeded": (400, "Max spot instance count exceeded"),
    "InstanceLimitExceeded": (400, "You have requested more instances than your current instance limit allows for the specified instance type."),
    "Unsupported": (400, "The requested configuration is currently not supported. Please check the documentation for supported configurations."),
    "SpotMaxPriceTooLow": (400, "Your Spot request price is lower than the minimum required Spot request fulfillment price."),
    "InsufficientFreeAddressesInSubnet": (400, "There are not enough free addresses in subnet '{subnet}' to satisfy the requested number of instances."),
    "UnfulfillableCapacity": (400, "Unable to fulfill capacity due to your request configuration."),
    "RequestLimitExceeded": (503, "Request limit exceeded."),
    "Unavailable": (503, "The service is unavailable. Try again later."),
    "InternalError": (500, "An internal error has occurred."),
}
# The codes CreateFleet reports per override (in <errorSet>) rather than for the whole call.
PER_OVERRIDE = {"InsufficientInstanceCapacity", "InsufficientCapacity", "VcpuLimitExceeded",
                "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded", "Unsupported",
                "SpotMaxPriceTooLow", "InsufficientFreeAddressesInSubnet", "UnfulfillableCapacity"}


# === SigV4 ===

def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def _signing_key(secret, date, region, service):
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _canonical_query(query):
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    quote = lambda s: urllib.parse.quote(s, safe="-_.~")
    return "&".join(f"{quote(k)}={quote(v)}" for k, v in sorted(pairs))


def _signature(secret, method, path, query, headers, signed, body, amz_date, scope):
    canonical_headers = "".join(f"{h}:{' '.join(headers.get(h, '').split())}\n" for h in signed)
    payload = headers.get("x-amz-content-sha256") or _sha256(body)
    canonical = "\n".join([method, urllib.parse.quote(path or "/", safe="/-_.~"), _canonical_query(query),
                           canonical_headers, ";".join(signed), payload])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, _sha256(canonical.encode())])
    date, region, service = scope.split("/")[:3]
    return hmac.new(_signing_key(secret, date, region, service), to_sign.encode(), hashlib.sha256).hexdigest()


def verify_signature(creds, method, path, query, headers, body):
    """Checks a header-signed SigV4 request the way moto and AWS do; True when valid."""
    auth = headers.get("authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return False
    fields = dict(part.strip().split("=", 1) for part in auth[len("AWS4-HMAC-SHA256 "):].split(","))
    access_key, scope = fields.get("Credential", "/").split("/", 1)
    if access_key != creds["access_key_id"]:
        return False
    signed = fields.get("SignedHeaders", "").split(";")
    expected = _signature(creds["secret_access_key"], method, path, query, headers, signed, body,
                          headers.get("x-amz-date", ""), scope)
    return hmac.compare_digest(expected, fields.get("Signature", ""))


def sign(creds, host, body):
    """Headers for a POST / to EC2 at `host` with form `body`, signed as the test user."""
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, date = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {"host": host, "content-type": "application/x-www-form-urlencoded; charset=utf-8",
               "x-amz-date": amz_date}
    scope = f"{date}/{creds['region']}/ec2/aws4_request"
    signed = sorted(headers)
    sig = _signature(creds["secret_access_key"], "POST", "/", "", headers, signed, body, amz_date, scope)
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={creds['access_key_id']}/{scope}, "
                                f"SignedHeaders={';'.join(signed)}, Signature={sig}")
    return headers


# === EC2 helpers ===

def error_xml(code, message):
    request_id = str(uuid.uuid4())
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f'<Message>{_esc(message)}</Message></Error></Errors><RequestID>{request_id}</RequestID></Response>').encode()


def _esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _el(tag, children=(), text=None):
    el = ET.Element(tag)
    if text is not None:
        el.text = str(text)
    for child in children:
        el.append(child)
    return el


def _strip_ns(el):
    for node in el.iter():
        node.tag = node.tag.split("}", 1)[-1]
    return el


def numbered(params, prefix):
    """[params of prefix.1, prefix.2, ...] as dicts of the rest of the key."""
    groups = {}
    for key, value in params.items():
        if key.startswith(prefix + "."):
            index, _, rest = key[len(prefix) + 1:].partition(".")
            if index.isdigit():
                groups.setdefault(int(index), {})[rest] = value
    return [groups[i] for i in sorted(groups)]


class State:
    """What the control API sets and what the EC2 side counts; guarded by one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.calls, self.requests, self.rules, self.next_rule = {}, [], [], 1
        self.spot_prices, self.on_demand_prices, self.tokens, self.subnet_zones = [], {}, {}, {}


class Proxy:
    def __init__(self, upstream, creds):
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port or 80
        self.creds = creds
        self.state = State()

    # --- rules ---

    def match(self, action, itype=None, zone=None, subnet=None, market=None, consume=True):
        """The first live rule for this request, with its `times` used up when consume is set."""
        with self.state.lock:
            for rule in self.state.rules:
                if rule["action"] not in ("*", action):
                    continue
                if any(rule.get(k) and rule[k] != v for k, v in
                       (("instance_type", itype), ("zone", zone), ("subnet", subnet), ("market", market))):
                    continue
                if rule.get("times") == 0:
                    continue
                if consume and rule.get("times") is not None:
                    rule["times"] -= 1
                return rule
        return None

    def zone_of(self, subnet):
        if not subnet:
            return None
        with self.state.lock:
            zone = self.state.subnet_zones.get(subnet)
        if zone is None:
            status, _, body = self.upstream_signed({"Action": "DescribeSubnets", "Version": "2016-11-15"})
            if status == 200:
                root = _strip_ns(ET.fromstring(body))
                with self.state.lock:
                    for item in root.iter("item"):
                        sid, az = item.findtext("subnetId"), item.findtext("availabilityZone")
                        if sid and az:
                            self.state.subnet_zones[sid] = az
                    zone = self.state.subnet_zones.get(subnet)
        return zone

    # --- upstream ---

    def upstream(self, method, target, headers, body):
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            return resp.status, [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP], resp.read()
        finally:
            conn.close()

    def upstream_signed(self, params):
        body = urllib.parse.urlencode(params).encode()
        host = f"{self.upstream_host}:{self.upstream_port}"
        return self.upstream("POST", "/", list(sign(self.creds, host, body).items()), body)

    # --- CreateFleet ---

    def create_fleet(self, params):
        """Carries out CreateFleet (type instant) over moto; returns (status, body)."""
        if params.get("Type", "maintain") != "instant":
            return 400, error_xml("Unsupported", "the fault proxy emulates CreateFleet of type instant only")
        spec = "TargetCapacitySpecification."
        total = int(float(params.get(spec + "TotalTargetCapacity", "0")))
        default_market = params.get(spec + "DefaultTargetCapacityType", "on-demand")
        od = params.get(spec + "OnDemandTargetCapacity")
        spot = params.get(spec + "SpotTargetCapacity")
        if od is not None or spot is not None:
            od = int(float(od)) if od is not None else max(0, total - int(float(spot)))
            targets = {"on-demand": od, "spot": total - od}
        else:
            targets = {default_market: total}
        configs = []
        for config in numbered(params, "LaunchTemplateConfigs"):
            lt = {k.split(".", 1)[1]: v for k, v in config.items() if k.startswith("LaunchTemplateSpecification.")}
            for override in numbered(config, "Overrides") or [{}]:
                configs.append((lt, override, self.zone_of(override.get("SubnetId")) or override.get("AvailabilityZone")))
        tag_params = {k: v for k, v in params.items() if k.startswith("TagSpecification")}
        instances, errors = [], []
        for market, target in targets.items():
            if target <= 0:
                continue
            options = params_prefixed(params, "SpotOptions." if market == "spot" else "OnDemandOptions.")
            plan, errs = self.plan(configs, market, target, options)
            errors += errs
            for (lt, override, _zone), count in plan:
                instances += self.launch(lt, override, market, count, tag_params)
        fleet_id = f"fleet-{uuid.uuid4()}"
        root = ET.Element("CreateFleetResponse", xmlns=NS)
        root.append(_el("requestId", text=str(uuid.uuid4())))
        root.append(_el("fleetId", text=fleet_id))
        root.append(_el("errorSet", errors))
        root.append(_el("fleetInstanceSet", instances))
        return 200, b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root)

    def plan(self, configs, market, target, options):
        strategy = options.get("AllocationStrategy", "lowest-price")
        if "prioritized" in strategy:
            key = lambda c: float(c[1].get("Priority", "inf"))
        elif strategy in ("lowest-price", "price-capacity-optimized", "lowestPrice"):
            key = lambda c: self.price(market, c[1].get("InstanceType"), c[2])
        else:
            key = lambda c: 0
        ordered = sorted(configs, key=key)  # stable: ties keep the caller's order
        groups = [ordered]
        if options.get("SingleAvailabilityZone") == "true":
            zones = list(dict.fromkeys(c[2] for c in ordered))
            groups = [[c for c in ordered if c[2] == z] for z in zones]
        minimum = int(float(options.get("MinTargetCapacity", "0")))
        tried = []
        for group in groups:
            tried.append(self.plan_group(group, market, target))
            if tried[-1][2] == 0:
                break
        plan, _, left, taken = min(tried, key=lambda t: t[2])  # the first of the fullest
        errors = [e for t in tried for e in t[1]]
        if target - left < minimum:  # all or nothing below MinTargetCapacity, as on AWS
            return [], errors
        with self.state.lock:
            for rule, count in taken:
                rule["capacity"] -= count
        return plan, errors

    def plan_group(self, group, market, target):
        """(plan, errors, capacity left unfilled, capacity taken per rule), committing nothing."""
        plan, errors, left, taken = [], [], float(target), {}
        for config in group:
            if left <= 0:
                break
            lt, override, zone = config
            itype, subnet = override.get("InstanceType"), override.get("SubnetId")
            rule = self.match("CreateFleet", itype, zone, subnet, market, consume=False)
            code = rule and rule.get("error")
            if rule and code in PER_OVERRIDE and rule.get("capacity") is None:
                self.match("CreateFleet", itype, zone, subnet, market)  # use up one of `times`
                errors.append(fleet_error(lt, override, market, code, rule, itype, zone, subnet))
                continue
            weight = float(override.get("WeightedCapacity", "1"))
            count = math.ceil(left / weight)
            if rule and rule.get("capacity") is not None:
                give = min(count, rule["capacity"] - taken.get(id(rule), (rule, 0))[1])
                taken[id(rule)] = (rule, taken.get(id(rule), (rule, 0))[1] + give)
                if give < count:
                    errors.append(fleet_error(lt, override, market, code or "InsufficientInstanceCapacity",
                                              rule, itype, zone, subnet))
                count = give
            if count > 0:
                plan.append((config, count))
                left -= count * weight
        return plan, errors, max(0, math.ceil(left)), list(taken.values())

    def price(self, market, itype, zone):
        with self.state.lock:
            if market == "spot":
                for p in self.state.spot_prices:
                    if p["instance_type"] == itype and p["zone"] == zone:
                        return float(p["price"])
            elif itype in self.state.on_demand_prices:
                return float(self.state.on_demand_prices[itype])
        return math.inf

    def launch(self, lt, override, market, count, tag_params):
        params = {"Action": "CreateFleet", "Version": "2016-11-15", "Type": "instant",
                  "TargetCapacitySpecification.TotalTargetCapacity": str(count),
                  "TargetCapacitySpecification.DefaultTargetCapacityType": market}
        for key, value in lt.items():
            params[f"LaunchTemplateConfigs.1.LaunchTemplateSpecification.{key}"] = value
        for key, value in override.items():
            if key not in ("Priority", "WeightedCapacity"):
                params[f"LaunchTemplateConfigs.1.Overrides.1.{key}"] = value
        params.update(tag_params)
        status, _, body = self.upstream_signed(params)
        if status != 200:
            raise UpstreamError(status, body)
        root = _strip_ns(ET.fromstring(body))
        instance_set = root.find("fleetInstanceSet")
        items = list(instance_set) if instance_set is not None else []
        if not items:
            return []
        # moto answers one item per instance; AWS one per override and market, with every id.
        merged = items[0]
        ids = merged.find("instanceIds")
        for item in items[1:]:
            ids.extend(item.find("instanceIds"))
        zone = self.zone_of(override.get("SubnetId")) or override.get("AvailabilityZone")
        if zone is not None and merged.find("availabilityZone") is None:
            merged.append(_el("availabilityZone", text=zone))
        if override.get("SubnetId") and merged.find("subnetId") is None:
            merged.append(_el("subnetId", text=override["SubnetId"]))
        return [merged]

    # --- DescribeSpotPriceHistory ---

    def spot_price_history(self, params):
        types = {v for k, v in params.items() if k.startswith("InstanceType.")}
        zones = {params["AvailabilityZone"]} if params.get("AvailabilityZone") else set()
        for f in numbered(params, "Filter"):
            values = {v for k, v in f.items() if k.startswith("Value.")}
            if f.get("Name") == "instance-type":
                types = types & values if types else values
            elif f.get("Name") == "availability-zone":
                zones = zones & values if zones else values
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        items = []
        with self.state.lock:
            for p in self.state.spot_prices:
                if (not types or p["instance_type"] in types) and (not zones or p["zone"] in zones):
                    items.append(_el("item", [_el("availabilityZone", text=p["zone"]),
                                              _el("instanceType", text=p["instance_type"]),
                                              _el("productDescription", text="Linux/UNIX"),
                                              _el("spotPrice", text=p["price"]),
                                              _el("timestamp", text=p.get("timestamp", now))]))
        root = ET.Element("DescribeSpotPriceHistoryResponse", xmlns=NS)
        root.append(_el("requestId", text=str(uuid.uuid4())))
        root.append(_el("spotPriceHistorySet", items))
        root.append(_el("nextToken", text=""))
        return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root)


class UpstreamError(Exception):
    def __init__(self, status, body):
        super().__init__(f"upstream answered {status}")
        self.status, self.body = status, body


def params_prefixed(params, prefix):
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def fleet_error(lt, override, market, code, rule, itype, zone, subnet):
    status_message = ERRORS.get(code, (400, code))[1]
    message = rule.get("message") or status_message.format(type=itype, subnet=subnet, in_zone=f" ({zone})" if zone else "")
    spec = [_el(k[0].lower() + k[1:], text=v) for k, v in lt.items()]
    over = [_el(k[0].lower() + k[1:], text=v) for k, v in override.items()
            if k in ("InstanceType", "SubnetId", "AvailabilityZone", "MaxPrice", "Priority", "WeightedCapacity")]
    return _el("item", [_el("launchTemplateAndOverrides", [_el("launchTemplateSpecification", spec),
                                                           _el("overrides", over)]),
                        _el("lifecycle", text=market), _el("errorCode", text=code),
                        _el("errorMessage", text=message)])


# === HTTP ===

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: Proxy = None  # set by main

    def log_message(self, fmt, *args):  # quiet: the tests read /_proxy/requests
        pass

    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    def dispatch(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self.reply(411, b"", [])
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path, _, query = self.path.partition("?")
        if path.startswith("/_proxy/"):
            return self.control(path[len("/_proxy/"):].strip("/"), body)
        try:
            self.ec2(path, query, body)
        except UpstreamError as err:
            self.reply(err.status, err.body, [("Content-Type", "text/xml")])
        except (ConnectionError, OSError) as err:
            self.reply(502, error_xml("InternalError", f"fault proxy: upstream: {err}"), [("Content-Type", "text/xml")])

    # --- the EC2 side ---

    def ec2(self, path, query, body):
        proxy, state = self.proxy, self.proxy.state
        params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        if self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
            params.update(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
        action = params.get("Action", "")
        with state.lock:
            state.calls[action] = state.calls.get(action, 0) + 1
        headers = {k.lower(): v for k, v in self.headers.items()}
        market = "spot" if params.get("InstanceMarketOptions.MarketType") == "spot" else None
        subnet = params.get("SubnetId") or params.get("NetworkInterface.1.SubnetId")
        zone = params.get("Placement.AvailabilityZone") or proxy.zone_of(subnet)
        rule = None
        if action != "CreateFleet":
            rule = proxy.match(action, params.get("InstanceType"), zone, subnet, market)
        else:  # whole-call faults only; per-override ones act inside create_fleet
            candidate = proxy.match(action, consume=False)
            if candidate and (candidate.get("status") or candidate.get("error") not in PER_OVERRIDE
                              or candidate.get("whole")) and not candidate.get("instance_type") \
                    and not candidate.get("zone") and not candidate.get("subnet") and candidate.get("capacity") is None:
                rule = proxy.match(action)
        if rule and rule.get("delay_ms"):
            threading.Event().wait(rule["delay_ms"] / 1000)
        if rule and (rule.get("error") or rule.get("status")) and not rule.get("drop"):
            return self.fault(action, rule, params, zone, subnet)

        token = params.get("ClientToken") if action in ("CreateFleet", "RunInstances") else None
        fingerprint = json.dumps(sorted((k, v) for k, v in params.items() if k != "ClientToken"))
        if token:
            with state.lock:
                seen = state.tokens.get((action, token))
            if seen is not None:
                if not verify_signature(proxy.creds, self.command, path, query, headers, body):
                    return self.auth_failure(action)
                if seen[0] != fingerprint:
                    self.record(action, "IdempotentParameterMismatch")
                    return self.reply(400, error_xml("IdempotentParameterMismatch",
                                                     f"The client token '{token}' was used with different parameters"),
                                      [("Content-Type", "text/xml")])
                self.record(action, "replayed")
                return self.reply(200, seen[1], [("Content-Type", "text/xml")])

        if action == "CreateFleet":
            if not verify_signature(proxy.creds, self.command, path, query, headers, body):
                return self.auth_failure(action)
            status, out = proxy.create_fleet(params)
            resp_headers = [("Content-Type", "text/xml")]
        else:
            status, resp_headers, out = proxy.upstream(self.command, self.path, list(self.headers.items()), body)
            if action == "DescribeSpotPriceHistory" and status == 200:
                with state.lock:
                    have_prices = bool(state.spot_prices)
                if have_prices:
                    out = proxy.spot_price_history(params)
        if token and status == 200:
            with state.lock:
                state.tokens[(action, token)] = (fingerprint, out)
        if rule and rule.get("drop"):
            self.record(action, "dropped")
            return self.reset()
        self.record(action, str(status), params if action == "CreateFleet" else None)
        self.reply(status, out, resp_headers)

    def fault(self, action, rule, params, zone, subnet):
        code = rule.get("error")
        if not code:
            self.record(action, f"status {rule['status']}")
            return self.reply(int(rule["status"]), b"", [])
        status, message = ERRORS.get(code, (400, code))
        message = rule.get("message") or message.format(type=params.get("InstanceType"), subnet=subnet,
                                                        in_zone=f" ({zone})" if zone else "")
        self.record(action, code)
        self.reply(int(rule.get("status") or status), error_xml(code, message), [("Content-Type", "text/xml")])

    def auth_failure(self, action):
        self.record(action, "AuthFailure")
        self.reply(401, error_xml("AuthFailure", "AWS was not able to validate the provided access credentials"),
                   [("Content-Type", "text/xml")])

    def record(self, action, outcome, params=None):
        entry = {"action": action, "outcome": outcome}
        if params is not None:
            entry["params"] = params
        with self.proxy.state.lock:
            self.proxy.state.requests.append(entry)
            del self.proxy.state.requests[:-10000]

    def reset(self):
        """Closes the connection with a TCP reset and no answer."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()

    def reply(self, status, body, headers):
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "server", "date"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # --- the control side ---

    def control(self, route, body):
        state = self.proxy.state
        data = json.loads(body or b"null")
        method = self.command
        with state.lock:
            if route == "health":
                out = {"ok": True}
            elif route == "calls" and method == "GET":
                out = dict(state.calls)
            elif route == "requests" and method == "GET":
                out = list(state.requests)
            elif route == "reset" and method == "POST":
                state.reset()
                out = {"ok": True}
            elif route == "faults" and method == "POST":
                if not data or "action" not in data:
                    return self.json(400, {"error": "a rule needs an action (or \"*\")"})
                rule = dict(data, id=state.next_rule)
                state.next_rule += 1
                state.rules.append(rule)
                out = {"id": rule["id"]}
            elif route == "faults" and method == "GET":
                out = list(state.rules)
            elif route == "faults" and method == "DELETE":
                state.rules.clear()
                out = {"ok": True}
            elif route.startswith("faults/") and method == "DELETE":
                rule_id = int(route.split("/", 1)[1])
                state.rules[:] = [r for r in state.rules if r["id"] != rule_id]
                out = {"ok": True}
            elif route == "prices" and method == "PUT":
                state.spot_prices = [dict(p, price=str(p["price"])) for p in data.get("spot", [])]
                state.on_demand_prices = dict(data.get("on_demand", {}))
                out = {"ok": True}
            else:
                return self.json(404, {"error": f"no route {method} /_proxy/{route}"})
        self.json(200, out)

    def json(self, status, value):
        self.reply(status, json.dumps(value).encode(), [("Content-Type", "application/json")])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", default=os.environ.get("KILN_TEST_EC2_ENDPOINT"), help="moto's endpoint")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", help="write the port here once listening")
    args = parser.parse_args()
    creds = {"access_key_id": os.environ.get("KILN_TEST_EC2_ACCESS_KEY_ID"),
             "secret_access_key": os.environ.get("KILN_TEST_EC2_SECRET_ACCESS_KEY"),
             "region": os.environ.get("KILN_TEST_EC2_REGION", "us-east-1")}
    if not args.upstream or not creds["access_key_id"] or not creds["secret_access_key"]:
        sys.exit("fault_proxy: set --upstream and KILN_TEST_EC2_{ACCESS_KEY_ID,SECRET_ACCESS_KEY} "
                 "(source the env file scripts/cloud-servers.sh writes)")
    Handler.proxy = Proxy(args.upstream, creds)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.rename(args.port_file + ".tmp", args.port_file)
    print(f"listening http://127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
