#!/usr/bin/env bash
# The cloud the tests rent machines from: moto's EC2 API on a free loopback port, with every
# request's SigV4 signature checked, and the path of amazon-ec2-metadata-mock (AEMM, installed by
# scripts/setup.sh --all), which the tests start once per booted instance. scripts/test.sh uses it; so
# can scripts/cluster.sh.
#
#   scripts/cloud-servers.sh install     make target/cloud-venv (moto[server] pinned below) unless
#                                        it is there at that version (setup.sh --all runs this)
#   scripts/cloud-servers.sh start DIR   install, start moto; writes DIR/env, the `export` lines:
#                                        KILN_TEST_EC2_ENDPOINT, KILN_TEST_EC2_REGION,
#                                        KILN_TEST_EC2_ACCESS_KEY_ID, KILN_TEST_EC2_SECRET_ACCESS_KEY,
#                                        KILN_TEST_AEMM (the binary), KILN_TEST_CLOUD_PYTHON (the
#                                        venv's python: boto3 and botocore are in it) and
#                                        KILN_TEST_EC2_FAULT_PROXY (scripts/cloud/fault_proxy.py,
#                                        which each test starts in front of moto)
#   scripts/cloud-servers.sh stop DIR    stop it
#
# moto checks a signature against the access keys of its own IAM users, and checks the user's
# policy allows the action. No user exists at start, so moto starts with
# INITIAL_NO_AUTH_ACTION_COUNT=3: exactly the three calls below (CreateUser, CreateAccessKey,
# PutUserPolicy allowing ec2:*, and making and assuming a role) go unchecked, and every request after them is checked. Start
# refuses to write DIR/env unless a request signed with a wrong secret is refused (AuthFailure).
# The user then makes a role allowed ecr:GetAuthorizationToken (trusting the user: moto checks
# the trust policy of an AssumeRole, and no instance calls it here) and assumes it: its temporary
# credentials (KILN_TEST_EC2_ROLE_*) are an instance role's, which the tests' AEMM serves to a
# runner that pulls from ECR with them (moto refuses a session token with a user's keys).
# KILN_TEST_EC2_REGION (default us-east-1) picks the region the credentials are scoped to.
set -euo pipefail

MOTO_VERSION=5.2.5
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KILN_TOOLS=${KILN_TOOLS:-${KILN_HOME:-$HOME/.kiln}/tools}
venv="$repo/target/cloud-venv"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

install() {
  if [ "$("$venv/bin/python" -c 'import moto; print(moto.__version__)' 2>/dev/null)" != "$MOTO_VERSION" ]; then
    echo "cloud-servers: installing moto[server] $MOTO_VERSION into $venv" >&2
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    nice "$venv/bin/pip" install -q --disable-pip-version-check "moto[server]==$MOTO_VERSION"
  fi
}

start() {
  local dir=$1 port endpoint region aemm out key secret
  install
  aemm="$KILN_TOOLS/bin/ec2-metadata-mock"
  [ -x "$aemm" ] || { echo "cloud-servers: $aemm is missing: run scripts/setup.sh --all" >&2; exit 1; }
  mkdir -p "$dir"
  region=${KILN_TEST_EC2_REGION:-us-east-1}
  port=$(free_port)
  endpoint="http://127.0.0.1:$port"
  # Instance types are checked against moto's list (an unknown type is refused, as on AWS).
  INITIAL_NO_AUTH_ACTION_COUNT=3 MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION=true \
    nice "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$dir/moto.log" 2>&1 &
  echo $! >"$dir/moto.pid"
  for _ in $(seq 1 150); do
    curl -fs "$endpoint/moto-api/" >/dev/null 2>&1 && break
    sleep 0.1
  done
  # The three unchecked calls; curl signs them (with any key: nothing is checked yet).
  iam() {
    curl -fsS --aws-sigv4 "aws:amz:$region:iam" --user bootstrap:bootstrap "$endpoint/" \
      --data-urlencode Version=2010-05-08 "$@"
  }
  iam --data-urlencode Action=CreateUser --data-urlencode UserName=kiln-test >/dev/null ||
    { cat "$dir/moto.log" >&2; echo "cloud-servers: moto did not start" >&2; exit 1; }
  out=$(iam --data-urlencode Action=CreateAccessKey --data-urlencode UserName=kiln-test)
  key=$(sed -n 's:.*<AccessKeyId>\([^<]*\)</AccessKeyId>.*:\1:p' <<<"$out")
  secret=$(sed -n 's:.*<SecretAccessKey>\([^<]*\)</SecretAccessKey>.*:\1:p' <<<"$out")
  iam --data-urlencode Action=PutUserPolicy --data-urlencode UserName=kiln-test \
    --data-urlencode PolicyName=ec2 \
    --data-urlencode 'PolicyDocument={"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["ec2:*","iam:CreateRole","iam:PutRolePolicy","sts:AssumeRole"],"Resource":"*"}]}' >/dev/null
  # From here on every request is checked: a wrong secret must be refused, the right one not.
  ec2() {
    curl -sS --aws-sigv4 "aws:amz:$region:ec2" --user "$1" "$endpoint/" \
      --data-urlencode Version=2016-11-15 --data-urlencode Action=DescribeRegions
  }
  ec2 "$key:wrong$secret" | grep -q '<Code>AuthFailure</Code>' ||
    { echo "cloud-servers: moto accepted a request signed with a wrong secret" >&2; exit 1; }
  ec2 "$key:$secret" | grep -q '<regionName>' ||
    { echo "cloud-servers: moto refused the test user's request" >&2; exit 1; }
  signed() {
    local service=$1
    shift
    curl -fsS --aws-sigv4 "aws:amz:$region:$service" --user "$key:$secret" "$endpoint/" "$@"
  }
  signed iam --data-urlencode Version=2010-05-08 --data-urlencode Action=CreateRole \
    --data-urlencode RoleName=kiln-test-instance \
    --data-urlencode 'AssumeRolePolicyDocument={"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":"arn:aws:iam::123456789012:user/kiln-test"},"Action":"sts:AssumeRole"}]}' >/dev/null
  signed iam --data-urlencode Version=2010-05-08 --data-urlencode Action=PutRolePolicy \
    --data-urlencode RoleName=kiln-test-instance --data-urlencode PolicyName=ecr \
    --data-urlencode 'PolicyDocument={"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"ecr:GetAuthorizationToken","Resource":"*"}]}' >/dev/null
  out=$(signed sts --data-urlencode Version=2011-06-15 --data-urlencode Action=AssumeRole \
    --data-urlencode RoleArn=arn:aws:iam::123456789012:role/kiln-test-instance \
    --data-urlencode RoleSessionName=kiln-test --data-urlencode DurationSeconds=43200)
  role_key=$(sed -n 's:.*<AccessKeyId>\([^<]*\)</AccessKeyId>.*:\1:p' <<<"$out")
  role_secret=$(sed -n 's:.*<SecretAccessKey>\([^<]*\)</SecretAccessKey>.*:\1:p' <<<"$out")
  role_token=$(sed -n 's:.*<SessionToken>\([^<]*\)</SessionToken>.*:\1:p' <<<"$out")
  [ -n "$role_token" ] || { echo "cloud-servers: moto's AssumeRole gave no credentials: $out" >&2; exit 1; }
  umask 077
  cat >"$dir/env" <<ENV
export KILN_TEST_EC2_ENDPOINT=$endpoint
export KILN_TEST_EC2_REGION=$region
export KILN_TEST_EC2_ACCESS_KEY_ID=$key
export KILN_TEST_EC2_SECRET_ACCESS_KEY=$secret
export KILN_TEST_EC2_ROLE_ACCESS_KEY_ID=$role_key
export KILN_TEST_EC2_ROLE_SECRET_ACCESS_KEY=$role_secret
export KILN_TEST_EC2_ROLE_SESSION_TOKEN=$role_token
export KILN_TEST_AEMM=$aemm
export KILN_TEST_CLOUD_PYTHON=$venv/bin/python
export KILN_TEST_EC2_FAULT_PROXY=$repo/scripts/cloud/fault_proxy.py
ENV
}

stop() {
  local dir=$1 pid
  [ -f "$dir/moto.pid" ] || return 0
  pid=$(cat "$dir/moto.pid")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

case "${1:-}" in
  install) install ;;
  start) start "$2" ;;
  stop) stop "$2" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
