"""Packages are found from the folders, not listed by hand: a new folder cannot be left out of the wheel.

setup.cfg keeps the metadata and the one mapping of top-level folders into the ``cs_run`` namespace
(``package_dir``); this file only turns each mapped folder's subpackages into package names.
"""

import configparser
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def _package_dir() -> dict[str, str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options"]["package_dir"].strip().splitlines()
    return dict((part.strip() for part in line.split("=", 1)) for line in lines if "=" in line)


def _packages(package_dir: dict[str, str]) -> list[str]:
    packages = []
    for package, folder in package_dir.items():
        packages.append(package)
        packages += [f"{package}.{sub}" for sub in find_packages(where=str(ROOT / folder))]
    return sorted(packages)


setup(packages=_packages(_package_dir()))
