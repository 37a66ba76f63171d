"""HiGHS's stray debug print (solvers.quiet) stays off `plan`'s output: on this instance — TorchRec's mixed EBC + EC
test model with HBM short, as the zoo plans it — `pair-balance`'s bound with whole options printed it among the
report before its MILP was silenced."""
from pathlib import Path

from shardbench.cli import main

SHORT = Path(__file__).parent / "data" / "mixed-ebc-ec-short.json"


def test_plan_prints_no_stray_line_from_highs(tmp_path, capfd):
    assert main(["plan", str(SHORT), "--oracle", "torchrec", "--budget", "3", "--solvers", "pair-balance",
                 "-o", str(tmp_path / "plan.json")]) == 0
    printed = capfd.readouterr().out
    assert "best plan: pair-balance" in printed and "Highs" not in printed
