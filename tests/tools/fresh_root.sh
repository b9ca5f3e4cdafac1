#!/usr/bin/env bash
# Runs the README's set-up on a host that cannot be warm: a Debian root made from nothing
# (mmdebstrap), entered with its own mount and PID namespaces, where nothing is installed,
# linked or mounted beyond the base system. Inside it: `scripts/setup.sh install` from a
# copy of the checkout (tracked and untracked-but-not-ignored files, as a clone has), then
# `iotune doctor --for trace`, which compiles and loads a real BPF program against the
# headers the set-up linked. The kernel is the host's (a root cannot bring its own), so a
# kernel without a headers package is exercised exactly as on such a host.
#
#   tests/tools/fresh_root.sh CHECKOUT WORKDIR [COMMAND...]
#
# COMMAND (default: the doctor check) runs in the checkout inside the root after the set-up.
# What is carried in from the host, and why: the host's pip configuration (index, find-links,
# constraints), since a site's pip settings are not part of iotune's set-up and this host can
# reach no PyTorch index of its own; the host's CA bundle, for a site whose proxy re-signs
# TLS; /etc/resolv.conf for the package mirrors; the host's apt archive cache
# (/var/cache/apt/archives, bound read-write), so that a .deb the host already fetched is not
# fetched again: which packages are installed is the root's own apt's decision.
# Exit status: the set-up's, else the command's. WORKDIR/root is removed on success and kept
# on failure for inspection (a second run removes it first).
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 CHECKOUT WORKDIR [COMMAND...]" >&2; exit 2; }
src="$(cd "$1" && pwd)"
work="$2"
shift 2
[ "$(id -u)" -eq 0 ] || { echo "fresh_root: needs root (mmdebstrap, chroot, mounts)" >&2; exit 2; }
command -v mmdebstrap >/dev/null || { echo "fresh_root: mmdebstrap not found (apt-get install mmdebstrap)" >&2; exit 2; }

. /etc/os-release
suite="${VERSION_CODENAME:?}"
mirror="${IOTUNE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
root="$work/root"
log() { printf 'fresh_root: %s\n' "$*" >&2; }

mkdir -p "$work"
if [ -e "$root" ]; then
    if findmnt -rn -o TARGET | grep -q "^$root/"; then
        echo "fresh_root: something is still mounted under $root" >&2; exit 2
    fi
    rm -rf --one-file-system "$root"
fi

start=$SECONDS
log "making a $suite root with mmdebstrap ($mirror)"
case "${ID:-}" in
    debian)
        sources=("deb $mirror $suite main" "deb $mirror $suite-updates main"
                 "deb ${mirror%/debian}/debian-security $suite-security main") ;;
    *) echo "fresh_root: only Debian hosts are supported (this is ${ID:-unknown})" >&2; exit 2 ;;
esac
mmdebstrap --quiet --variant=apt --include=ca-certificates "$suite" "$root" "${sources[@]}" >&2
log "root ready in $((SECONDS - start)) s"

# the checkout as a clone would have it: no virtualenv, no caches, no build outputs
mkdir -p "$root/src"
(cd "$src" && git ls-files -z -c -o --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$root/src"
cp /etc/resolv.conf "$root/etc/resolv.conf"

# the host's pip configuration, with the local folders it names (bound read-only below)
pip_env=()
binds=()
for f in /etc/pip.conf /etc/xdg/pip/pip.conf /etc/xdg/pip/constraints.txt; do
    if [ -f "$f" ]; then mkdir -p "$root$(dirname "$f")"; cp "$f" "$root$f"; fi
done
for v in PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_CONSTRAINT PIP_DEFAULT_TIMEOUT; do
    if [ -n "${!v:-}" ]; then pip_env+=("$v=${!v}"); fi
done
while read -r dir; do
    [ -d "$dir" ] && binds+=("$dir")
done < <(cat /etc/pip.conf /etc/xdg/pip/pip.conf 2>/dev/null \
         | grep -oE '(file://)?/[^ ]+' | sed 's|^file://||; s|/simple$||' | sort -u
         printf '%s\n' ${PIP_FIND_LINKS:-})
# the host's CA bundle: a site whose proxy re-signs TLS (as here) needs it for PyPI
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/host-ca-bundle.crt"
    pip_env+=("PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt")
fi

cmd=("$@")
[ ${#cmd[@]} -gt 0 ] || cmd=(iotune doctor --for trace)
inner_env=(HOME=/root LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive
           PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${pip_env[@]}")

log "entering the root: scripts/setup.sh install, then: ${cmd[*]}"
# Own mount namespace: every mount below disappears with it. Own PID namespace: anything the
# set-up starts inside the root ends when its shell does. A fresh sysfs, without the host's
# tracefs mounted in it, so the set-up's own tracefs step runs.
set +e
unshare --mount --pid --fork --kill-child -- bash -euo pipefail -c '
    root=$1; shift
    nbinds=$1; shift
    binds=("${@:1:$nbinds}"); shift "$nbinds"
    mount --make-rprivate /
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys"
    mount --rbind /dev "$root/dev"
    for d in "${binds[@]}"; do
        mkdir -p "$root$d"; mount --bind -o ro "$d" "$root$d"
    done
    if [ -d /var/cache/apt/archives/partial ]; then
        mount --bind /var/cache/apt/archives "$root/var/cache/apt/archives"
    fi
    exec chroot "$root" /usr/bin/env -i "$@"
' fresh-root "$root" "${#binds[@]}" "${binds[@]}" "${inner_env[@]}" \
    bash -euo pipefail -c 'cd /src && scripts/setup.sh install && exec "$@"' setup "${cmd[@]}"
rc=$?
set -e
log "exit status $rc after $((SECONDS - start)) s"
if [ "$rc" -eq 0 ]; then rm -rf --one-file-system "$root"; fi
exit "$rc"
