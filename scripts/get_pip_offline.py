"""Offline stand-in for the get-pip bootstrap script that ansible-test downloads.

ansible-test creates empty virtual environments for sanity and unit tests and bootstraps pip in them with a
get-pip script fetched from the internet. Where that host is unreachable, this script (placed in ansible-test's
cache folder by scripts/ansible_test.sh) does the same job with the interpreter's own ensurepip, then installs
the pip version ansible-test asked for from the configured package index.
"""
import ensurepip
import os
import subprocess
import sys

ensurepip.bootstrap(upgrade=True)
# ensurepip points PIP_CONFIG_FILE at /dev/null in this process; the real install must see the machine's pip
# configuration (index, certificates) again.
env = {key: value for key, value in os.environ.items() if key not in ("PIP_CONFIG_FILE", "ENSUREPIP_OPTIONS")}
args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "--quiet"] + args, env=env))
