# Sourced by the .ci scripts: installing what a script needs before it runs.

# Installs those of the Debian packages "$@" that are not installed yet (as root),
# adding the arm64 architecture first when one of them is an `:arm64` package.
install_missing() {
    local p missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
            || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    echo "=== installing: ${missing[*]}"
    if [[ " ${missing[*]}" == *:arm64* ]]; then
        dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Makes the virtual environment "$1" with $PYTHON (default python3) unless it is there,
# installing python3-venv first where the interpreter lacks venv (Debian's python3 has
# no ensurepip without it).
make_venv() {
    local venv=$1 python=${PYTHON:-python3}
    [[ -x $venv/bin/python ]] && return 0
    if ! "$python" -m venv "$venv" 2>/dev/null; then
        rm -rf "$venv"
        if command -v apt-get >/dev/null; then
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
        fi
        "$python" -m venv "$venv"
    fi
}
