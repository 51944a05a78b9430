#!/usr/bin/env bash
# Builds the image the docker tests run, without a registry: a root filesystem made of
# busybox-static (every applet linked), imported with `docker import`. The tag is the hash of
# its inputs, so a rerun with nothing changed reuses the image. Prints the image name.
set -euo pipefail

busybox=$(command -v busybox)
script_hash=$(cat "${BASH_SOURCE[0]}" "$busybox" | sha256sum | cut -c1-12)
image="kiln-test/busybox:$script_hash"
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
mkdir -p "$rootfs"/{bin,etc,tmp,root,kiln}
chmod 1777 "$rootfs/tmp"
cp "$busybox" "$rootfs/bin/busybox"
for applet in $("$busybox" --list); do
  [ -e "$rootfs/bin/$applet" ] || ln -s busybox "$rootfs/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
tar --numeric-owner --owner=0 --group=0 --mtime='2020-01-01' --sort=name -C "$rootfs" -c . \
  | docker import --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' - "$image" >/dev/null
echo "$image"
