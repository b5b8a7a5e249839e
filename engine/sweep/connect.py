"""Where a sweep runs: its address checked before anything starts, the
cluster reached, and Ray started or joined, each failure one line (a
SweepError). The addresses are a job server's (http://HEAD:8265: the sweep
runs there as a Ray job, engine.sweep.job), a GCS's (HOST:PORT: the runner
here is the driver), 'auto' on a node of a cluster, or 'local' (an embedded
Ray on this machine, the default).
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
import tempfile
import urllib.parse

CONNECT_TIMEOUT_S = 5.0
RAY_MISSING = ("Ray is not installed: sweeps run on Ray Tune; install it with "
               "pip install 'microgpt-gui[sweep]' (or pip install 'ray[tune]' optuna)")
ADDRESS_KINDS = ("http://HEAD:8265 (the head's job server: the sweep runs on the cluster as a Ray job), "
                 "HOST:PORT (the head's GCS, 6379 unless `ray start --head --port` chose another: the sweep's "
                 "driver runs here and joins the cluster), 'auto' on a node of the cluster, or 'local'")


class SweepError(RuntimeError):
    """The sweep cannot start or go on; the message says why."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---- addresses ---------------------------------------------------------------------------

def is_job_address(address: str | None) -> bool:
    """A job server's address (http:// or https://), as opposed to a GCS's HOST:PORT."""
    return bool(address) and address.strip().lower().startswith(("http://", "https://"))


def server_url(address: str) -> tuple[str, str, int]:
    """(the URL, its host, its port) of a job server address."""
    url = address.strip().rstrip("/")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        parts, port = None, 0
    if parts is None or not parts.hostname or parts.path not in ("", "/"):
        raise SweepError(f"--address {address!r} is no job server address: give http://HEAD:8265 (the head's "
                         "dashboard port, 8265 unless `ray start --head --dashboard-port` chose another)")
    return url, parts.hostname, port


def split_address(address: str) -> tuple[str, int]:
    """A GCS address's host and port (job server addresses, http://, go to engine.sweep.job)."""
    if "://" in address:
        raise SweepError(f"--address {address!r}: Ray Client (ray://) addresses are not used; give "
                         + ADDRESS_KINDS)
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SweepError(f"--address {address!r} is no Ray address: give {ADDRESS_KINDS}")
    return host.strip("[]"), int(port)


def check_address(address: str | None) -> None:
    """SweepError unless address is one a sweep can go to (not whether anything listens there)."""
    if address in (None, "", "local", "auto"):
        return
    if is_job_address(address):
        server_url(address)
    else:
        split_address(address)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_reachable(host: str, port: int, what: str, how_to_start: str,
                    timeout: float = CONNECT_TIMEOUT_S) -> None:
    """SweepError unless something listens at host:port: "cannot reach WHAT: why.
    HOW_TO_START, or check the address"."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = "nothing listens there" if isinstance(exc, ConnectionRefusedError) else (exc.strerror or str(exc))
        raise SweepError(f"cannot reach {what}: {reason}. {how_to_start}, or check the address") from None


# ---- Ray ---------------------------------------------------------------------------------

def connect(address: str | None, cpus: int | None, in_job: bool = False) -> str:
    """ray.init: an embedded local Ray, a cluster by address, or (in_job) the cluster this
    Ray job runs on; the address used."""
    import ray

    if in_job:  # the job's supervisor gives its driver the cluster's GCS address
        address = os.environ.get("RAY_ADDRESS") or "auto"
        try:
            ray.init(address=address, log_to_driver=False, logging_level="WARNING")
        except ConnectionError as exc:
            raise SweepError(f"the sweep's job cannot join its cluster at {address}: {first_line(exc)}") from None
        return address
    if address in (None, "", "local"):
        # every address on loopback: nothing of a local sweep listens on the network
        ray.init(address="local", num_cpus=cpus or os.cpu_count() or 1, include_dashboard=False,
                 log_to_driver=False, logging_level="WARNING", _node_ip_address="127.0.0.1")
        return "local"
    kwargs = {}
    if address != "auto":
        host, port = split_address(address)
        check_reachable(host, port, f"the Ray cluster at {host}:{port}",
                        f"Start its head with `ray start --head --port {port}`")
        if is_loopback(host):  # else Ray picks this machine's network address, which a loopback cluster refuses
            kwargs["_node_ip_address"] = "127.0.0.1"
    try:
        with stderr_kept() as logged:
            ray.init(address=address, log_to_driver=False, logging_level="WARNING", **kwargs)
    except Exception as exc:
        text = f"{exc}\n{''.join(logged)}"  # a refused token shows only in Ray's log lines
        if type(exc).__name__ == "AuthenticationError" or "InvalidAuthToken" in text or "Unauthenticated" in text:
            raise SweepError(f"the Ray cluster at {address} refused this sweep's token: give the app the "
                             "cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; "
                             "`ray get-auth-token` on the head prints it) and RAY_AUTH_MODE=token") from None
        if isinstance(exc, ConnectionError):
            raise SweepError(f"cannot connect to the Ray cluster at {address}: {first_line(exc)}") from None
        raise
    return address


@contextlib.contextmanager
def stderr_kept():
    """What this process writes to stderr (file descriptor 2: Ray's C++ too) inside the
    block, kept in the list it yields as well as written to stderr."""
    kept: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield kept
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            kept.append(log.read())
            sys.stderr.write(kept[-1])
            sys.stderr.flush()
