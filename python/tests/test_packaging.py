# SPDX-License-Identifier: MIT
"""The project as a packager and a new user see it: one version number
everywhere, `pip install ./python` finding an installed libclient without
environment variables, `make install` into a DESTDIR (multiarch LIBDIR, no
package fetching, no MPS units unless asked, man links, a pkg-config file
that builds the example program), and the example program itself."""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

import rmsnormd
from conftest import BUILD, REPO

VERSION = open(os.path.join(REPO, "VERSION")).read().strip()
MULTIARCH = "x86_64-linux-gnu"


def _clean_env(**extra):
    # No variable that points the package or the loader at a library, and no
    # outer make's jobserver.
    env = {k: v for k, v in os.environ.items()
           if k not in ("RMSNORMD_LIBCLIENT", "RN_BUILD", "LD_LIBRARY_PATH", "PYTHONPATH",
                        "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "GNUMAKEFLAGS")}
    env.update(extra)
    return env


def test_one_version():
    header = open(os.path.join(REPO, "client", "rmsnorm_client.h")).read()
    parts = [re.search(r"^#define RN_VERSION_%s (\d+)$" % k, header, re.M).group(1)
             for k in ("MAJOR", "MINOR", "PATCH")]
    assert ".".join(parts) == VERSION
    assert rmsnormd.__version__ == VERSION
    assert rmsnormd.version() == VERSION  # the library's rn_version()
    pc = open(os.path.join(BUILD, "rmsnorm-client.pc")).read()
    assert "\nVersion: %s\n" % VERSION in pc


def test_pip_install_finds_installed_library():
    """pip installs the package under a prefix; the library installed under
    the same prefix is found with no environment variable set."""
    py = sys.executable
    if (subprocess.run([py, "-c", "import setuptools, wheel"], capture_output=True).returncode
            or subprocess.run([py, "-m", "pip", "--version"], capture_output=True).returncode):
        pytest.skip("%s lacks pip, setuptools or wheel for an offline build" % py)
    tmp = tempfile.mkdtemp(prefix="rn-pip-")
    try:
        src = os.path.join(tmp, "src")
        # A copy, so that the build leaves nothing in the checkout; VERSION
        # is a link out of python/, so the copy takes the file itself.
        shutil.copytree(os.path.join(REPO, "python"), src, symlinks=False,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        prefix = os.path.join(tmp, "prefix")
        r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--no-build-isolation", "--no-index", "--prefix", prefix, src],
                           capture_output=True, text=True, env=_clean_env(), cwd=tmp)
        assert r.returncode == 0, r.stdout + r.stderr
        # <prefix>/lib/pythonX.Y/site-packages, or Debian's
        # <prefix>/local/lib/pythonX.Y/dist-packages.
        inits = glob.glob(os.path.join(prefix, "**", "rmsnormd", "__init__.py"), recursive=True)
        assert len(inits) == 1, inits
        site = os.path.dirname(os.path.dirname(inits[0]))
        assert os.path.exists(os.path.join(site, "rmsnormd", "VERSION"))
        # The libdir of the prefix the package went to.
        libdir = os.path.dirname(os.path.dirname(site))
        shutil.copy(os.path.join(BUILD, "librmsnorm_client.so.0"),
                    os.path.join(libdir, "librmsnorm_client.so.0"))
        # PYTHONPATH only to reach the temporary prefix's site folder, which
        # is on no interpreter's path; nothing names the library.
        code = "import rmsnormd, rmsnormd._lib as l; print(rmsnormd.version(), l.lib().path)"
        r = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp,
                           env=_clean_env(PYTHONPATH=site))
        assert r.returncode == 0, r.stderr
        version, path = r.stdout.split()
        assert version == VERSION
        assert path == os.path.join(libdir, "librmsnorm_client.so.0")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _make_install(dest, *args):
    # A fake apt-get first on PATH: installing must never reach for it.
    fake = os.path.join(dest, "fakebin")
    os.makedirs(fake)
    for tool in ("apt-get", "apt", "pip", "pip3"):
        with open(os.path.join(fake, tool), "w") as f:
            f.write("#!/bin/sh\necho \"$0 $*\" >> %s/fetched\nexit 1\n" % dest)
        os.chmod(os.path.join(fake, tool), 0o755)
    env = _clean_env(PATH=fake + ":" + os.environ["PATH"])
    r = subprocess.run(["make", "--no-print-directory", "-C", REPO, "BUILD=" + BUILD,
                        "DESTDIR=" + os.path.join(dest, "root"), "PREFIX=/usr",
                        "LIBDIR=/usr/lib/" + MULTIARCH] + list(args) + ["install"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not os.path.exists(os.path.join(dest, "fetched")), open(
        os.path.join(dest, "fetched")).read()
    return os.path.join(dest, "root")


@pytest.fixture(scope="module")
def installed():
    tmp = tempfile.mkdtemp(prefix="rn-inst-")
    yield _make_install(tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def _pkgconfig(root, *args):
    if not shutil.which("pkg-config"):
        pytest.skip("pkg-config is not installed (make deps installs it)")
    env = _clean_env(PKG_CONFIG_PATH=os.path.join(root, "usr/lib", MULTIARCH, "pkgconfig"),
                     PKG_CONFIG_SYSROOT_DIR=root)
    env.pop("PKG_CONFIG_LIBDIR", None)
    r = subprocess.run(["pkg-config"] + list(args) + ["rmsnorm-client"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_install_layout(installed):
    lib = os.path.join(installed, "usr/lib", MULTIARCH)
    assert os.path.exists(os.path.join(lib, "librmsnorm_client.so.0"))
    assert os.path.exists(os.path.join(lib, "librmsnorm_client.a"))
    pc = open(os.path.join(lib, "pkgconfig", "rmsnorm-client.pc")).read()
    assert "\nlibdir=${prefix}/lib/%s\n" % MULTIARCH in pc
    assert "msgpack" not in pc.split("Requires.private:")[1].split("\n")[0]
    # The MPS units are an opt-in.
    assert glob.glob(os.path.join(installed, "usr/lib/systemd/*/nvidia-cuda-mps.service")) == []
    man3 = os.path.join(installed, "usr/share/man/man3")
    for fn in ("rn_connect", "rn_rmsnorm_bwd", "rn_stats", "rn_version"):
        assert open(os.path.join(man3, fn + ".3")).read() == ".so man3/rmsnorm_client.3\n"
    assert os.path.exists(os.path.join(installed, "usr/share/bash-completion/completions/rmsnormctl"))
    assert os.path.exists(os.path.join(installed, "usr/share/doc/rmsnormd/LICENSE"))


def test_install_with_mps():
    tmp = tempfile.mkdtemp(prefix="rn-inst-")
    try:
        root = _make_install(tmp, "WITH_MPS=1")
        for sub in ("system", "user"):
            assert os.path.exists(os.path.join(root, "usr/lib/systemd", sub,
                                               "nvidia-cuda-mps.service"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_pkgconfig_static_names_no_host_path(installed):
    out = _pkgconfig(installed, "--static", "--libs", "--define-variable=cudalibdir=/opt/cuda/lib")
    assert "-lrmsnorm_client" in out
    assert "/usr/local/cuda" not in out
    assert "msgpack" not in out


def test_cppflags_reach_the_compiler():
    r = subprocess.run(["make", "-n", "-B", "-C", REPO, "BUILD=" + BUILD, "V=1",
                        "CPPFLAGS=-D_FORTIFY_SOURCE=2 -DRN_CPPFLAGS_SEEN",
                        os.path.join(BUILD, "obj/client/client.o")],
                       capture_output=True, text=True, env=_clean_env())
    assert r.returncode == 0, r.stderr
    assert "-DRN_CPPFLAGS_SEEN" in r.stdout


def test_example_builds_against_installed_pc(installed, daemon, tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    flags = _pkgconfig(installed, "--cflags", "--libs").split()
    exe = str(tmp_path / "bwd_host")
    r = subprocess.run([cc, "-std=c11", "-Wall", "-Werror", os.path.join(REPO, "examples",
                        "bwd_host.c"), "-o", exe] + flags + ["-lm"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lib = os.path.join(installed, "usr/lib", MULTIARCH)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                       env=_clean_env(LD_LIBRARY_PATH=lib, RMSNORMD_ENDPOINT=daemon.endpoint))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "largest error" in r.stdout


def test_example_of_the_build(daemon):
    exe = os.path.join(BUILD, "examples", "bwd_host")
    if not os.path.exists(exe):
        pytest.fail("%s is missing: make builds examples/*.c" % exe)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                       env=_clean_env(RMSNORMD_ENDPOINT=daemon.endpoint))
    assert r.returncode == 0, r.stdout + r.stderr


def _exposure(unit, user=False):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (make deps installs systemd)")
    xdg = tempfile.mkdtemp(prefix="rn-xdg-")
    try:
        r = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager"]
                           + (["--user"] if user else []) + [unit], capture_output=True,
                           text=True, env=_clean_env(XDG_RUNTIME_DIR=xdg), timeout=120)
    finally:
        shutil.rmtree(xdg, ignore_errors=True)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    return float(m.group(1))


def test_mps_units_hardened():
    # systemd/README.md ("The MPS units") gives these numbers and the reason
    # for each exposure left.
    assert _exposure(os.path.join(REPO, "systemd", "nvidia-cuda-mps.service")) <= 2.2
    assert _exposure(os.path.join(REPO, "systemd", "user", "nvidia-cuda-mps.service"),
                     user=True) <= 6.2


def test_library_sets_struct_size(client):
    """The structs the library fills in say how much of them it filled."""
    import ctypes
    from rmsnormd import _lib
    lib = _lib.lib()
    for fn, cls in (("rn_health", _lib.HealthInfo), ("rn_stats", _lib.StatsInfo),
                    ("rn_server_info", _lib.ServerInfo)):
        out = cls()
        assert getattr(lib, fn)(client._handle, ctypes.byref(out)) == 0
        assert out.struct_size == ctypes.sizeof(cls), fn
        assert list(out.reserved) == [0] * _lib.RESERVED_WORDS, fn
    # The caller's structs: the init macros' value, set by the mirrors.
    assert _lib.BwdArgs().struct_size == ctypes.sizeof(_lib.BwdArgs)
    assert _lib.ConnectOpts().struct_size == ctypes.sizeof(_lib.ConnectOpts)


def test_bash_completion():
    if not shutil.which("bash"):
        pytest.skip("no bash")
    script = os.path.join(REPO, "client", "ctl", "rmsnormctl.bash")
    probe = ('source "%s"; COMP_WORDS=(rmsnormctl st); COMP_CWORD=1; _rmsnormctl; '
             'echo "${COMPREPLY[@]}"; COMP_WORDS=(rmsnormctl stats --p); COMP_CWORD=2; '
             '_rmsnormctl; echo "${COMPREPLY[@]}"' % script)
    r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first.split() == ["stats"]
    assert second.split() == ["--prometheus"]
