#!/usr/bin/env bash
# pyllm on aarch64, end to end, on an x86 Linux machine: an arm64 Debian root under qemu-user, a plain
# `pip install` of the committed tree in it, and the logits of a real model on every ARM tier against this machine's.
# Not part of `make test` (10-15 minutes on 2 cores); `make check-arm64-install` runs it. Needs root (debootstrap,
# chroot, binfmt_misc) and the network (Debian, PyPI).
#   ROOT=/work/arm64root MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf tests/arm64_install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${ROOT:-$PWD/build/arm64root}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
export DEBIAN_FRONTEND=noninteractive

command -v debootstrap >/dev/null && [ -e /usr/bin/qemu-aarch64-static ] ||
    { apt-get update -qq && apt-get install -y -qq debootstrap qemu-user-static binfmt-support; }
[ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64

if [ ! -x "$ROOT/usr/bin/python3" ]; then
    debootstrap --arch=arm64 --foreign --variant=minbase \
        --include=python3,python3-venv,python3-dev,build-essential,ca-certificates bookworm "$ROOT" \
        http://deb.debian.org/debian
    cp /usr/bin/qemu-aarch64-static "$ROOT/usr/bin/"
    chroot "$ROOT" /debootstrap/debootstrap --second-stage
fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# a proxy's certificate authorities, where this machine trusts extra ones
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
    chroot "$ROOT" update-ca-certificates >/dev/null
fi

rm -rf "$ROOT/root/pyllm" && mkdir -p "$ROOT/root/pyllm" "$ROOT/root/models"
git archive HEAD | tar -x -C "$ROOT/root/pyllm"
cp "$MODEL" "$ROOT/root/models/model.gguf"
mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
trap 'umount "$ROOT/proc" || true' EXIT
chroot "$ROOT" /bin/bash -c 'rm -rf /root/venv && python3 -m venv /root/venv &&
    env -u PIP_FIND_LINKS /root/venv/bin/pip install -q /root/pyllm'

want=$(python3 tests/arm64_logits_digest.py "$MODEL" | cut -d'|' -f2-)
echo "x86 $(python3 -c 'from pyllm import kernels; print(kernels.active_tier())'):$want"
status=0
for cpu in max neoverse-n1 cortex-a53; do  # neon_i8mm, neon_dotprod, neon
    got=$(chroot "$ROOT" /usr/bin/env QEMU_CPU=$cpu /root/venv/bin/python /root/pyllm/tests/arm64_logits_digest.py \
        /root/models/model.gguf)
    echo "aarch64 -cpu $cpu: $got"
    [ "$(echo "$got" | cut -d'|' -f2-)" = "$want" ] || { echo "differs from x86"; status=1; }
done
exit $status
