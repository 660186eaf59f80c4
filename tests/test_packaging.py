"""setup.cfg lists its packages by hand (the audit's folder spark/ installs as qmailpy_audit,
which packages = find: cannot express): every package folder must be in that list, and the
installed audit must not claim the top-level name "spark"."""
import configparser
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    return cfg


def _listed(cfg, key):
    return [line.strip() for line in cfg["options"][key].splitlines() if line.strip()]


def test_every_package_folder_is_listed_in_setup_cfg():
    cfg = _setup_cfg()
    mapped = dict(line.replace(" ", "").split("=") for line in _listed(cfg, "package_dir"))
    folders = {name: folder for name, folder in mapped.items()}
    expected = set()
    for top in ("qmailpy",):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                expected.add(os.path.relpath(dirpath, ROOT).replace(os.sep, "."))
    for name, folder in folders.items():
        assert os.path.isfile(os.path.join(ROOT, folder, "__init__.py")), (name, folder)
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                expected.add(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    assert set(_listed(cfg, "packages")) == expected


def test_the_audit_is_installed_as_qmailpy_audit_not_spark():
    script = ("import importlib.util as u, sys\n"
              "sys.path = [p for p in sys.path if p not in ('', %r)]\n"
              "print(u.find_spec('qmailpy_audit') is not None, u.find_spec('spark') is not None)\n"
              % ROOT)
    out = subprocess.run([sys.executable, "-c", script], cwd="/", capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["True", "False"]
