#!/usr/bin/env bash
# Puts the password of the Scylla role log-ingest logs in as (`kiln`) into SSM Parameter Store,
# where the Scylla nodes read it at first boot (to make the role) and log-ingest at every boot:
# /NAME/scylla/kiln, a SecureString encrypted with the kiln KMS key. A new random password
# unless one is given on stdin; it never enters the Terraform state.
#
#   deploy/terraform/put-scylla-password.sh NAME KMS_KEY              # after the first apply
#
# NAME is the deployment's `name` variable; KMS_KEY the kiln key (its ARN or alias). Run it with
# credentials that may ssm:PutParameter under /NAME/scylla/. Changing it later needs the role's
# password changed in Scylla too (ALTER ROLE kiln) before log-ingest restarts.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 NAME KMS_KEY [< password]" >&2; exit 64; }
name=$1 key=$2
if [ -t 0 ]; then
  password=$(head -c 32 /dev/urandom | base64 | tr -d '/+=\n')
else
  password=$(cat)
fi
aws ssm put-parameter --name "/$name/scylla/kiln" --type SecureString --key-id "$key" \
  --overwrite --value "$password" >/dev/null
echo "put-scylla-password: /$name/scylla/kiln"
