# Sourced by scripts/test and .ci/run, from the repository root: the project's virtualenv.
#   ensure_venv if-missing   create .venv if missing; install the project unless it is installed
#   ensure_venv always       create .venv if missing; (re)install the project (CI)

# The first python3.N on PATH that is 3.11 or newer (pyenv shims of absent versions fail the test).
find_python() {
    local candidate
    for candidate in python3 python3.13 python3.12 python3.11; do
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    echo "no Python 3.11 or newer on PATH" >&2
    return 1
}

ensure_venv() {
    if [[ ! -x .venv/bin/python ]]; then
        local python
        python=$(find_python)
        echo "creating .venv with $("$python" -V)" >&2
        "$python" -m venv .venv
    fi
    if [[ $1 == always || ! -x .venv/bin/rmqkit || ! -x .venv/bin/pytest ]]; then
        echo "installing rmqkit with its dev extras into .venv" >&2
        .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
    fi
}
