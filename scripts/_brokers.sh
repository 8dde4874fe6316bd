# Sourced by scripts/broker-up and scripts/broker-ctl: the RabbitMQ versions the suite runs on,
# where each node lives, and how to run its CLI tools. Needs log/die defined by the caller.
#
#   version  node                  AMQP  management  distribution  from
#   3.10     the host's own node    5672  15672       25672         Debian bookworm (the host)
#   4.0      rmq40@$(hostname -s)   5740  15740       25740         a Debian trixie root (chroot)
#   4.3      rmq43@$(hostname -s)   5743  15743       25743         a Debian sid root (chroot)
#
# The roots are built once by debootstrap and cached outside the checkout, in
# $RMQKIT_ROOTS (default /var/cache/rmqkit/roots/{trixie,sid}); a root counts as built only once
# it has been renamed into place with its .rmqkit-root marker, so an interrupted build is never
# reused. Each chroot node keeps its data and logs inside its root (/var/lib/rabbitmq,
# /var/log/rabbitmq there) and shares the host's epmd; the default node is never touched.

VERSIONS="3.10 4.0 4.3"
ROOTS=${RMQKIT_ROOTS:-/var/cache/rmqkit/roots}
SHORT_HOST=$(hostname -s)

have() { command -v "$1" >/dev/null 2>&1; }

# The Debian package's CLI tools run only as root or as the rabbitmq user.
ADMIN=()
if ((EUID != 0)) && id -u rabbitmq >/dev/null 2>&1 && [[ $(id -un) != rabbitmq ]] &&
    have sudo && sudo -n true 2>/dev/null; then
    ADMIN=(sudo -n)
fi
admin() { "${ADMIN[@]}" "$@"; }

# select_version V: sets VERSION, SUITE (empty for the host's node), ROOT, NODE, PORT,
# MGMT_PORT, DIST_PORT. 3.10 keeps RMQKIT_PORT/RMQKIT_MGMT_PORT (today's behaviour).
select_version() {
    VERSION=$1 SUITE= ROOT= NODE=
    case $1 in
    3.10)
        PORT=${RMQKIT_PORT:-5672} MGMT_PORT=${RMQKIT_MGMT_PORT:-15672}
        return 0
        ;;
    4.0) SUITE=trixie NODE=rmq40@$SHORT_HOST PORT=5740 ;;
    4.3) SUITE=sid NODE=rmq43@$SHORT_HOST PORT=5743 ;;
    *) return 1 ;;
    esac
    # Distribution port: AMQP + 20000, clear of 25672 (default node) and 25681-25683 (fault cluster).
    MGMT_PORT=$((PORT + 10000)) DIST_PORT=$((PORT + 20000)) ROOT=$ROOTS/$SUITE
}

# in_root CMD...: CMD inside the root, with a clean environment (no RABBITMQ_* of the caller's).
in_root() {
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        LANG=C.UTF-8 LC_ALL=C.UTF-8 "$@"
}

# mount_root: /proc and /dev inside the root, and the host's /etc/hosts (the node name's host
# part must resolve there as it does outside). Idempotent.
mount_root() {
    ((EUID == 0)) || die "the $VERSION node runs under chroot: run this as root" 77
    mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
    mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
    cp /etc/hosts "$ROOT/etc/hosts"
}

root_built() { [[ -f $ROOT/.rmqkit-root ]]; }

# rmq TOOL ARGS...: a RabbitMQ CLI tool (rabbitmqctl, rabbitmq-plugins, rabbitmq-diagnostics)
# for the selected node: the root's own tools for a chroot node (the host's 3.10 CLI may not
# talk to a 4.x node), the host's for 3.10. Adds -n NODE unless ARGS name a node already.
rmq() {
    local tool=$1 arg
    shift
    if [[ -z $SUITE ]]; then
        admin "$tool" "$@"
        return
    fi
    root_built || die "the $VERSION root $ROOT is not built yet: run scripts/broker-up --version $VERSION" 69
    mount_root
    for arg in "$@"; do
        [[ $arg == -n || $arg == --node || $arg == --node=* ]] && {
            in_root "$tool" "$@"
            return
        }
    done
    in_root "$tool" -n "$NODE" "$@"
}
