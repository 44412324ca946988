"""A throwaway PostgreSQL server for the tests: initdb in a temporary directory, a socket there and a loopback port.

``python -m tests.helpers.postgres start DIR`` starts one (installing Debian's ``postgresql`` first when it is
missing and this is root on a machine with apt) and prints its superuser URL; ``stop DIR`` stops it.
``scripts/test.sh`` does both and exports the URL as ``CONTEXT_SIDECAR_TEST_PG``; the tests' fixtures start
their own when that is unset. initdb refuses to run as root, so as root the server runs as ``postgres``.

Authentication: ``trust`` on the socket and on 127.0.0.1, except the role ``PASSWORD_ROLE``, whose password
is checked (scram-sha-256): the tests of a refused password and of passwords kept out of logs use it.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

SUPERUSER = "postgres"
PASSWORD_ROLE = "cs_password_user"
"""The one role whose password is checked."""
START_SECONDS = 60


class Unavailable(Exception):
    """No PostgreSQL server can be run here; the message says why."""


def bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: Debian's newest /usr/lib/postgresql/N/bin, else the PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def install() -> None:
    """Debian's postgresql, as root with apt (what CI's machine may lack)."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable("PostgreSQL is not installed (initdb not found): apt-get install postgresql")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", "postgresql"], env=env)
    if done.returncode != 0 or bin_dir() is None:
        raise Unavailable("apt-get install postgresql failed")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    """argv run as ``postgres`` when this is root (initdb refuses root)."""
    return ["runuser", "-u", SUPERUSER, "--", *argv] if os.geteuid() == 0 else argv


def url(directory: Path) -> str:
    """The superuser URL of the server in ``directory`` (over the loopback port)."""
    port = (directory / "port").read_text().strip()
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres"


def start(directory: Path, allow_install: bool = True) -> str:
    """Start a new server in ``directory`` (created; must not hold one); returns its superuser URL."""
    binaries = bin_dir()
    if binaries is None:
        if not allow_install:
            raise Unavailable("PostgreSQL is not installed (no initdb)")
        install()
        binaries = bin_dir()
        assert binaries is not None
    directory.mkdir(parents=True, exist_ok=True)
    data, sock = directory / "data", directory / "sock"
    sock.mkdir(exist_ok=True)
    log = directory / "server.log"
    log.touch()
    if os.geteuid() == 0:
        shutil.chown(directory, SUPERUSER)
        shutil.chown(sock, SUPERUSER)
        shutil.chown(log, SUPERUSER)
    user = ["-U", SUPERUSER]
    initdb = subprocess.run(_as_server_user([str(binaries / "initdb"), "-D", str(data), *user, "-A", "trust",
                                             "--no-sync", "-E", "UTF8", "--locale", "C"]),
                            capture_output=True, text=True)
    if initdb.returncode != 0:
        raise Unavailable(f"initdb failed: {initdb.stderr.strip() or initdb.stdout.strip()}")
    hba = data / "pg_hba.conf"
    hba.write_text(f"local all all trust\n"
                   f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"
                   f"host all all 127.0.0.1/32 trust\n")
    port = _free_port()
    (directory / "port").write_text(str(port))
    options = (f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
               f"-c full_page_writes=off -c max_connections=300 -c shared_buffers=64MB")
    started = subprocess.run(_as_server_user([str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l",
                                              str(log), "-w", "-t", str(START_SECONDS), "start"]),
                             capture_output=True, text=True)
    if started.returncode != 0:
        raise Unavailable(f"pg_ctl start failed: {started.stderr.strip()} {log.read_text()[-2000:]}")
    return url(directory)


def pg_ctl(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run pg_ctl on the server in ``directory`` (as its user)."""
    binaries = bin_dir()
    assert binaries is not None
    return subprocess.run(_as_server_user([str(binaries / "pg_ctl"), "-D", str(directory / "data"), *args]),
                          capture_output=True, text=True)


def stop(directory: Path) -> None:
    """Stop the server in ``directory`` and remove the directory."""
    if (directory / "data" / "postmaster.pid").exists():
        pg_ctl(directory, "stop", "-m", "immediate", "-w")
    shutil.rmtree(directory, ignore_errors=True)


def restart(directory: Path) -> None:
    """Start the (stopped) server in ``directory`` again on its port."""
    port = (directory / "port").read_text().strip()
    options = (f"-p {port} -k {directory / 'sock'} -c listen_addresses=127.0.0.1 -c fsync=off "
               f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=300 -c shared_buffers=64MB")
    done = pg_ctl(directory, "-o", options, "-l", str(directory / "server.log"), "-w", "-t", str(START_SECONDS),
                  "start")
    if done.returncode != 0:
        raise Unavailable(f"pg_ctl start failed: {done.stderr.strip()}")


def main(argv: list[str]) -> int:
    """``start DIR`` (prints the URL) or ``stop DIR``."""
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: python -m tests.helpers.postgres start|stop DIR", file=sys.stderr)
        return 2
    directory = Path(argv[1])
    if argv[0] == "stop":
        stop(directory)
        return 0
    began = time.monotonic()
    try:
        print(start(directory))
    except Unavailable as error:
        print(f"PostgreSQL: {error}", file=sys.stderr)
        return 1
    print(f"PostgreSQL started in {time.monotonic() - began:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
