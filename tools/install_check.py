# SPDX-License-Identifier: GPL-3.0-or-later
"""Install the built collection tarball somewhere else and use it from there.

Proves the tarball is complete: `ansible-galaxy collection install` into a scratch collections
path, then `ansible-doc` and an ad-hoc gpu_facts run against a simulated H100 node, from a working
directory outside this checkout and without its ansible.cfg.  First, that it ships nothing it must not
(dist.tarball_problems: the URL placeholder, developer docs, a Markdown link to a file it lacks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gpuharden_lab.noderoot import build_node_root

from dist import tarball_problems  # tools/dist.py, beside this file

VENV_BIN = Path(sys.executable).parent


def main(tarball: str) -> int:
    problems = tarball_problems(tarball)
    if problems:
        print("%s must not ship:\n  %s" % (tarball, "\n  ".join(problems)), file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="gpuharden-install-") as scratch:
        scratch_path = Path(scratch)
        scratch_path.chmod(0o755)
        collections = scratch_path / "collections"
        env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
        env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
        env["ANSIBLE_LOCALHOST_WARNING"] = "false"
        subprocess.run(
            [str(VENV_BIN / "ansible-galaxy"), "collection", "install", "-p", str(collections), tarball],
            env=env, cwd=scratch, check=True, stdout=subprocess.DEVNULL,
        )
        installed = collections / "ansible_collections" / "gpuharden" / "k8s"
        assert (installed / "plugins/modules/gpu_facts.py").is_file(), "gpu_facts missing from the tarball"
        doc = subprocess.run(
            [str(VENV_BIN / "ansible-doc"), "--json", "gpuharden.k8s.gpu_facts"],
            env=env, cwd=scratch, check=True, capture_output=True, text=True,
        )
        assert json.loads(doc.stdout)["gpuharden.k8s.gpu_facts"]["doc"]["module"] == "gpu_facts"

        node = build_node_root(scratch_path / "node", "h100-sxm5-80gb")
        env.update(node.env())
        run = subprocess.run(
            [
                str(VENV_BIN / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
                "-e", "ansible_python_interpreter=%s" % sys.executable,
                "-m", "gpuharden.k8s.gpu_facts", "-a", "root=%s" % node.root, "-o",
            ],
            env=env, cwd=scratch, check=True, capture_output=True, text=True,
        )
        result = json.loads(run.stdout.split("=>", 1)[1])
        facts = result["ansible_facts"]["gpuharden"]
        assert facts["nvml"]["available"], facts["nvml"]["reason"]
        assert facts["gpu_count"] == 4, facts["gpu_count"]
        drift = drift_from_installed(scratch_path, env)
        print(
            "installed collection at %s: ansible-doc renders, gpu_facts saw %d GPUs (%s), gpuharden drift ran its "
            "drift_check.yml (exit %d, %d finding(s) on this machine)" % (installed, facts["gpu_count"], facts["gpus"][0]["name"], *drift)
        )
    return 0


def drift_from_installed(scratch, env):
    """`gpuharden drift` finds drift_check.yml in the installed collection (no checkout, no ansible.cfg) and reports.

    It audits this machine itself (read-only; its run lock goes to the scratch directory), so the figures are
    whatever this machine shows; what must hold is that the playbook ran and the report and metrics were written.
    """
    inventory = scratch / "hosts.yml"
    inventory.write_text(json.dumps({"gpu_nodes": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "gpuharden_kubeconfig": str(scratch / "no-cluster.kubeconfig"),
        "gpuharden_lock_path": str(scratch / "run" / "gpuharden.lock")}}}}))
    report, metrics = scratch / "drift.json", scratch / "drift.prom"
    run = subprocess.run(
        [str(VENV_BIN / "gpuharden"), "drift", "-q", "-i", str(inventory), "--report", str(report), "--prometheus", str(metrics)],
        env={key: value for key, value in env.items() if not key.startswith("GPUHARDEN_NVML")}, cwd=scratch,
        capture_output=True, text=True, check=False,
    )
    # 4: the cluster side is not checked (no cluster here), and says so: never drift, never clean
    assert run.returncode == 4, "gpuharden drift exited %d: %s" % (run.returncode, run.stderr[-2000:])
    data = json.loads(report.read_text())
    assert list(data["nodes"]) == ["localhost"], data
    consistency = data["cluster"]["checks"]["consistency"]
    assert consistency["state"] == "not_checked" and "no such file on the controller" in consistency["cause"], consistency
    assert run.stdout.startswith("NOT CHECKED: the cluster side"), run.stdout[:500]
    assert "gpuharden_last_run_timestamp_seconds" in metrics.read_text()
    assert not (scratch / "run" / "gpuharden.lock").exists(), "the drift run left its lock behind"
    return run.returncode, len(data["nodes"]["localhost"]["findings"])


if __name__ == "__main__":
    sys.exit(main(os.path.abspath(sys.argv[1])))
