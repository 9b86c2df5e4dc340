"""A real Slurm cluster on this machine, for tests and benchmarks.

One ``munged`` (own key and socket), one ``slurmctld`` and one ``slurmd`` per
node, all on 127.0.0.1 with free ports and a state directory of their own
(recipe: docs/testing.md, "A real Slurm cluster on one machine"). Every
daemon is started here and stopped by the pid in its pid file; nothing
outside the temp directory is written. ``SLURM_CONF`` points commands at it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "mungekey")


def installed() -> bool:
    return all(shutil.which(d) or Path("/usr/sbin", d).exists() for d in DAEMONS)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class Cluster:
    """munge + slurmctld + ``nodes`` slurmd, started by ``start`` and stopped by ``stop``."""

    def __init__(self, nodes: int = 2, prefix: str = "tpu"):
        self.names = [f"{prefix}-{i}" for i in range(nodes)]
        self.dir = Path(tempfile.mkdtemp(prefix="pw-slurm-"))
        # Readable by other users, so that a command run as another user reaches munge.
        self.dir.chmod(0o755)
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._pidfiles: list[Path] = []

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> Cluster:
        try:
            self._start_munge()
            self._write_conf()
            self._daemon([_sbin("slurmctld"), "-c", "-f", str(self.conf)], self.dir / "slurmctld.pid")
            for name in self.names:
                self._daemon([_sbin("slurmd"), "-N", name, "-f", str(self.conf)], self.dir / f"slurmd-{name}.pid")
            self.wait_nodes("idle", timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            if self.conf.exists() and self._alive(self.dir / "slurmctld.pid"):
                # Jobs first, so that their processes end with them.
                self.run("scancel", "--full", "--user", "root", check=False)
                deadline = time.monotonic() + 10
                while (
                    time.monotonic() < deadline and self.run("squeue", "-h", "-t", "R,CG", check=False).stdout.strip()
                ):
                    time.sleep(0.2)
        except subprocess.SubprocessError:
            pass  # the daemons are stopped below all the same
        finally:
            for pidfile in reversed(self._pidfiles):
                self._kill(pidfile)
            shutil.rmtree(self.dir, ignore_errors=True)

    def _start_munge(self) -> None:
        key = self.dir / "munge.key"
        subprocess.run([_sbin("mungekey"), "-c", "-f", "-k", str(key)], check=True, capture_output=True)
        key.chmod(0o400)
        self.munge_socket = self.dir / "munge.socket"
        self.munged_argv = [
            _sbin("munged"),
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--pid-file={self.dir / 'munged.pid'}",
            f"--log-file={self.dir / 'munged.log'}",
            f"--seed-file={self.dir / 'munged.seed'}",
        ]
        self.start_munge()

    def start_munge(self) -> None:
        self._daemon(self.munged_argv, self.dir / "munged.pid")

    def stop_munge(self) -> None:
        self._kill(self.dir / "munged.pid")
        self.munge_socket.unlink(missing_ok=True)

    def _write_conf(self) -> None:
        host = socket.gethostname()
        ctld, *nodes = _free_ports(1 + len(self.names))
        self.ctld_port = ctld
        d = self.dir
        (d / "state").mkdir()
        (d / "spool").mkdir()
        lines = [
            "ClusterName=pwtest",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root",
            f"SlurmctldPort={ctld}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SchedulerType=sched/builtin",
            # Pending jobs looked at every 2 s, not 60: a requeued job made eligible starts within seconds.
            "SchedulerParameters=sched_interval=2",
            # 1: a node an admin set DOWN stays down until resumed (2 brings it back when its job is killed).
            "ReturnToService=1",
            "MessageTimeout=3",
            "SlurmdTimeout=6",
            "MinJobAge=600",
            "MpiDefault=none",
            # A job in the higher-tier partition `urgent` preempts `tpu` jobs, which Slurm requeues.
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for name, port in zip(self.names, nodes, strict=True):
            lines.append(
                f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 RealMemory=1000"
                f" Features=slice{self.names.index(name)}"
            )
        nodes_list = ",".join(self.names)
        lines.append(f"PartitionName=tpu Nodes={nodes_list} Default=YES MaxTime=INFINITE State=UP PriorityTier=1")
        lines.append(f"PartitionName=urgent Nodes={nodes_list} MaxTime=INFINITE State=UP PriorityTier=10")
        self.conf.write_text("\n".join(lines) + "\n")

    def _daemon(self, argv: list[str], pidfile: Path) -> None:
        self._pidfiles.append(pidfile)
        pidfile.unlink(missing_ok=True)
        subprocess.run(argv, env=self.env, check=True, capture_output=True, timeout=30)
        deadline = time.monotonic() + 10
        while not self._alive(pidfile):
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-800:] for p in self.dir.glob("*.log"))
                raise RuntimeError(f"{argv[0]} did not start: {logs}")
            time.sleep(0.05)

    @staticmethod
    def _pid(pidfile: Path) -> int | None:
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _alive(self, pidfile: Path) -> bool:
        pid = self._pid(pidfile)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def _kill(self, pidfile: Path) -> None:
        pid = self._pid(pidfile)
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while self._alive(pidfile) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._alive(pidfile):
            os.kill(pid, signal.SIGKILL)

    # -- commands -------------------------------------------------------------
    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, check=check, capture_output=True, text=True, timeout=30)

    def submit(self, script: str, *options: str) -> str:
        """``sbatch --parsable OPTIONS`` of a script body; returns the job id."""
        path = self.dir / f"job-{time.monotonic_ns()}.sbatch"
        path.write_text(script)
        return self.submit_env(str(path), {}, *options)

    def submit_env(self, path: str, env: dict[str, str], *options: str) -> str:
        """``sbatch`` of a script file with ``env`` added to the job's environment."""
        out = subprocess.run(
            ["sbatch", "--parsable", f"--chdir={self.dir}", f"--output={self.dir}/%j.out", *options, path],
            env={**self.env, **env},
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip().split(";")[0]

    def job(self, job: str) -> dict[str, str]:
        line = self.run("scontrol", "show", "job", "-o", job).stdout.strip()
        return dict(field.split("=", 1) for field in line.split() if "=" in field)

    def wait_job(self, job: str, state: str, timeout: float = 30) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job)
            if info.get("JobState") == state:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} is {info.get('JobState')}, not {state}, after {timeout} s")
            time.sleep(0.1)

    def node_state(self, name: str) -> str:
        # One line per partition holding the node, all with the node's one state.
        return self.run("sinfo", "-h", "-N", "-n", name, "-o", "%T").stdout.split("\n")[0].strip()

    def wait_nodes(self, state: str, timeout: float = 30, names: list[str] | None = None) -> None:
        deadline = time.monotonic() + timeout
        names = names or self.names
        while True:
            states = {n: self.node_state(n) for n in names} if self.conf.exists() else {}
            if states and all(s == state for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes are {states}, not all {state}, after {timeout} s")
            time.sleep(0.2)

    def kill_slurmd(self, name: str) -> None:
        """SIGKILL the node's slurmd, as a crash would (its job's processes live on)."""
        pid = self._pid(self.dir / f"slurmd-{name}.pid")
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

    def start_slurmd(self, name: str) -> None:
        self._pidfiles.remove(self.dir / f"slurmd-{name}.pid")
        self._daemon([_sbin("slurmd"), "-N", name, "-f", str(self.conf)], self.dir / f"slurmd-{name}.pid")

    def set_node(self, name: str, state: str, reason: str = "") -> None:
        argv = ["scontrol", "update", f"nodename={name}", f"state={state}"]
        if reason:
            argv.append(f"reason={reason}")
        self.run(*argv)


@pytest.fixture(scope="module", name="slurm")
def slurm_cluster():
    """A running two-node Slurm cluster (module scope); stopped by pid afterwards."""
    if os.geteuid() != 0 or not installed():
        pytest.skip("needs root and Debian's slurm-wlm and munge (make test installs them)")
    cluster = Cluster().start()
    yield cluster
    cluster.stop()
