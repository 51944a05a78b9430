#!/usr/bin/env bash
# Usage: test-ca.sh DIR HOST [CLIENT] — makes a throw-away CA (DIR/ca.pem) and a server certificate
# for HOST signed by it (DIR/server.pem, DIR/server.key, mode 0600), for the test servers that
# speak TLS (Postgres, Cassandra's secure mode); with CLIENT, a client certificate of that name
# too (DIR/client.pem, DIR/client.key). openssl comes with ca-certificates, which setup.sh installs.
set -euo pipefail
dir=$1
host=$2
mkdir -p "$dir"
cd "$dir"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=kiln test CA" \
  -keyout ca.key -out ca.pem >/dev/null 2>&1
openssl req -newkey rsa:2048 -nodes -subj "/CN=$host" -keyout server.key -out server.csr >/dev/null 2>&1
if [[ $host =~ ^[0-9.]+$ ]]; then san="IP:$host"; else san="DNS:$host"; fi
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' "$san" > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile server.ext -out server.pem >/dev/null 2>&1
if [[ -n "${3:-}" ]]; then
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$3" -keyout client.key -out client.csr >/dev/null 2>&1
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > client.ext
  openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile client.ext -out client.pem >/dev/null 2>&1
  chmod 0600 client.key
  rm -f client.csr client.ext
fi
chmod 0600 server.key ca.key
rm -f server.csr server.ext ca.srl
