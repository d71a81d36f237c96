# Sourced by scripts/test: make (once) and activate the virtual environment
# .venv-<python version> with the project and its dev and bench dependency groups.
# (scripts/demo makes a lighter one of its own, .venv-demo-<python version>.)
# PYTHON picks the interpreter (default python3). The dev group's mysqlclient builds from
# source, so before installing, scripts/ensure-mariadb --build-deps makes sure the MariaDB
# client headers, pkg-config and a compiler are there (apt-get as root), or stops loudly.
PYTHON=${PYTHON:-python3}
version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv=".venv-$version"
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
stamp="$venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    echo "installing the project and its dev dependencies into $venv"
    scripts/ensure-mariadb --build-deps "$PYTHON" &&
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip>=25.1" &&
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --group dev --group bench -e . &&
        touch "$stamp" ||
        { echo "ERROR: installing into $venv failed" >&2; return 1 2>/dev/null || exit 1; }
fi
export PATH="$PWD/$venv/bin:$PATH"
export DJANGO_SETTINGS_MODULE=project.settings
