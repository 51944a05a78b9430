#!/usr/bin/env bash
# Puts each kiln service's NATS NKey seed into SSM Parameter Store, where its instances read it
# at boot (/NAME/nats/<service>, SecureString encrypted with the kiln KMS key; each instance
# role may read its own service's parameter only). The seeds never enter the Terraform state.
#
#   kiln nats-users --seeds-dir ./nats-creds --out ./nats-users.conf    # once; keep the dir safe
#   deploy/terraform/put-nats-seeds.sh NAME KMS_KEY ./nats-creds         # after the first apply
#   # and for tofu apply: export TF_VAR_nats_users_conf="$(cat ./nats-users.conf)"
#
# NAME is the deployment's `name` variable; KMS_KEY the kiln key (its ARN or alias, the `kms`
# module's key). Run it with credentials that may ssm:PutParameter under /NAME/nats/.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 NAME KMS_KEY SEEDS_DIR" >&2; exit 64; }
name=$1 key=$2 dir=$3
for service in api scheduler runner log-ingest item-batch advisor predictor provisioner; do
  seed="$dir/$service.nk"
  [ -r "$seed" ] || { echo "put-nats-seeds: $seed is missing: run kiln nats-users --seeds-dir $dir" >&2; exit 1; }
  aws ssm put-parameter --name "/$name/nats/$service" --type SecureString --key-id "$key" \
    --overwrite --value "file://$seed" >/dev/null
  echo "put-nats-seeds: /$name/nats/$service"
done
