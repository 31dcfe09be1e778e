#!/usr/bin/env python3
"""Prints the hosts this machine's pip downloads packages from, comma-separated: the netloc of
pip's configured index-url (and extra-index-url) when set, else pip's own default index and its
file host, as the installed pip names them. Tests that need a real package index read their
hosts from here, so no registry's name is written in the repository."""

import subprocess
import sys
import urllib.parse


def configured(key: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", key],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        return []
    return [urllib.parse.urlsplit(u).hostname or "" for u in out.stdout.split()]


hosts = [h for key in ("global.index-url", "global.extra-index-url") for h in configured(key) if h]
if not hosts:
    from pip._internal.models.index import PyPI  # the default index, as pip defines it

    hosts = [PyPI.netloc, PyPI.file_storage_domain]
print(",".join(dict.fromkeys(hosts)))
