"""hack/cpu-sampler: what it attributes a test run's CPU to (docs/testing.md, "Where the CPU goes by test")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.unit.test_release import load_script

sampler = load_script("cpu-sampler")
UID = "0f9a3c1e-4b2d-4c8e-9a1f-2b3c4d5e6f70"


def test_a_test_namespace_is_reported_under_its_test_name() -> None:
    assert sampler.stem("t1a2b-gw0-a-harness-solves-two-turns-with-every-call-ca-3f2a1b") == (
        "a-harness-solves-two-turns-with-every-call-ca"
    )
    assert sampler.stem("t1a2b-load-dd09aa") == "load", "the exclusive phase's namespaces have no worker"
    assert sampler.stem("load-t838f-gw1-3aa8827") == "load", "a word of the test's own before the prefix"
    assert sampler.stem("quiet-t1a2b-gw1-abcd1234") == "quiet"
    assert sampler.stem("kube-system") == "kube-system", "anything else under its own name"


def test_a_pod_is_found_in_its_namespace_by_its_log_folder() -> None:
    folders = ["other_pod_00000000-0000-0000-0000-000000000000", f"t1a2b-gw1-load-ab12cd_e1-a1_{UID}"]
    assert sampler.namespace_of(UID, folders) == "t1a2b-gw1-load-ab12cd"
    assert sampler.namespace_of(UID, folders[:1]) is None


def test_processes_are_kinds_and_test_processes_carry_their_worker() -> None:
    worker = {"PYTEST_XDIST_WORKER": "gw2"}
    operator = [sys.executable, "/repo/.venv/bin/episode-operator", "run", "--namespace", "t1a2b-gw2-*"]
    assert sampler.process_kind("python", operator, worker) == "operator (gw2)"
    assert sampler.process_kind("kube-apiserver", ["kube-apiserver"], {}) == "kube-apiserver"
    assert sampler.process_kind("containerd-shim", ["containerd-shim-runc-v2"], {}) == "containerd-shim"
    bootstrap = [sys.executable, "-c", "import sys;exec(eval(sys.stdin.readline()))"]
    assert sampler.process_kind("python", bootstrap, {}) == "pytest", "an xdist worker, by execnet's bootstrap"
    assert sampler.process_kind("helm", ["helm", "install"], worker) == "helm (gw2)"


def test_increments_are_counted_once_and_a_reused_pid_is_a_new_process() -> None:
    totals = sampler.Totals()
    totals.process_reading((10, 1), "kubelet", 100.0, first_sample=True)  # ran before the recording: not counted
    totals.process_reading((10, 1), "kubelet", 103.0, first_sample=False)
    totals.process_reading((11, 5), "helm", 2.0, first_sample=False)  # started since the last reading: all of it
    totals.process_reading((10, 9), "kubectl", 1.0, first_sample=False)  # pid 10 again, another start time
    assert totals.processes == {"kubelet": 3.0, "helm": 2.0, "kubectl": 1.0}
    totals.pod_reading(UID, "ns", 4.0)
    totals.pod_reading(UID, "ns", 6.5)
    assert totals.pods == {"ns": 6.5}, "a pod cgroup's usage is cumulative from the pod's start"


def test_the_report_sums_tests_across_workers_and_says_what_is_unattributed() -> None:
    totals = {
        "busy": 100.0,
        "wall": 60.0,
        "pods": {"t1a2b-gw0-load-aaaaaa": 30.0, "t1a2b-gw1-load-bbbbbb": 10.0},
        "processes": {"operator (gw0)": 5.0, "operator (gw1)": 5.0, "kube-apiserver": 20.0},
    }
    text = sampler.report(totals, 10)
    assert "unattributed 30" in text
    assert "| load | 40 | 40.0% |" in text
    assert "| operator (workers) | 10 | 10.0% |" in text


def test_pods_are_read_from_every_qos_folder_and_one_gone_meanwhile_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pods come and go while the recorder reads: a folder gone between two reads is skipped (a CI run's recorder
    died on one), and the pods of Guaranteed (directly under kubepods) and Burstable are both read."""
    other = "1f9a3c1e-4b2d-4c8e-9a1f-2b3c4d5e6f71"
    for folder in (tmp_path / f"pod{UID}", tmp_path / "burstable" / f"pod{other}" / "c0ffee"):
        folder.mkdir(parents=True)
    (tmp_path / f"pod{UID}" / "cpuacct.usage").write_text("2500000000\n")
    (tmp_path / "burstable" / f"pod{other}" / "cpuacct.usage").write_text("500000000\n")
    (tmp_path / "burstable" / f"pod{other}" / "c0ffee" / "cgroup.procs").write_text("41\n42\n")
    monkeypatch.setattr(sampler, "KUBEPODS", tmp_path)  # no besteffort folder: gone meanwhile
    assert sorted(sampler.read_pods()) == sorted([(UID, 2.5), (other, 0.5)])
    assert sampler.pod_pids() == {41, 42}
    assert sampler.listing(tmp_path / "gone") == []
