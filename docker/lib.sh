# shellcheck shell=bash
# Sourced by the docker/*.sh scripts: one-line errors with exit 2, and DRY_RUN.

die() {
    echo "$(basename "$0"): error: $*" >&2
    exit 2
}

dry_run() {
    [ -n "${DRY_RUN:-}" ] && [ "${DRY_RUN}" != 0 ]
}

# Run a command, or with DRY_RUN=1 print it, shell-quoted, so that it can be pasted or parsed.
run() {
    if dry_run; then
        local line
        printf -v line '%q ' "$@"
        echo "${line% }"
    else
        "$@"
    fi
}

is_count() {
    [[ $1 =~ ^[0-9]+$ ]]
}
