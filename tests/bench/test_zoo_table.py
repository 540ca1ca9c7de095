"""benchmarks/zoo_table.py: the zoo bench's ranked section for docs/strategies.md, read from
the bench's own JSON (a small bench on the shipped math bank here), each arm's citation from
its module, written between the page's markers and nowhere else."""

from __future__ import annotations

from benchmark_scripts import benchmark_script


def test_the_zoo_section_is_read_from_the_bench_and_written_between_the_markers(tmp_path, monkeypatch):
    with benchmark_script("zoo_table") as zoo:
        out = tmp_path / "zoo"
        code = zoo.main(["--out", str(out), "bank=math_python_smollm2", "strategies=uniform,trace,knapsack,dapo",
                         "seeds=2", "steps=1", "epochs=0", "candidates=16", "root_budget=8", "warmup_prompts=16",
                         "predictor=constant", "oracle_upper_bound=false"])
        assert code == 0
        import json

        results = json.loads((out / "bench.json").read_text())
        lines = zoo.section(results, None)
        text = "\n".join(lines)
        assert lines[0] == zoo.START and lines[-1] == zoo.END
        rows = text.splitlines()
        assert "bank `math_python_smollm2.jsonl.gz` (256 prompts, 8 roots each), 2 repetitions x 1 steps" in text
        for arm, cited in (("knapsack", "Knapsack RL (arXiv:2509.25849)"), ("dapo", "DAPO dynamic sampling "
                           "(arXiv:2503.14476)"), ("uniform", "GRPO (arXiv:2402.03300)")):
            row = next(line for line in rows if line.startswith(f"| {arm} "))
            assert cited in row, row
        ranked = [e["arm"] for e in results["ranking"]["rows"]]  # the table's order is the bench's ranking
        assert [line.split("|")[1].strip() for line in rows if line.startswith("| ") and line.split("|")[1].strip()
                in ranked][:4] == ranked
        doc = tmp_path / "page.md"
        doc.write_text(f"before\n{zoo.START}\nold table\n{zoo.END}\nafter\n")
        monkeypatch.setattr(zoo, "DOC", doc)
        zoo.write(lines)
        zoo.write(lines)  # idempotent: the section replaced, not appended
        page = doc.read_text()
        assert page.startswith("before\n") and page.endswith("\nafter\n") and "old table" not in page
        assert page.count(zoo.START) == 1 and page.count("| knapsack ") == 3  # its ranking row, minus uniform, minus trace
        monkeypatch.setattr(zoo, "IMAGES", tmp_path / "images")  # the command line's --write: page and plots
        assert zoo.main(["--from", str(out), "--write"]) == 0
        assert (tmp_path / "images" / "ranking.png").stat().st_size > 0 and (tmp_path / "images" / "paired.png").is_file()
        assert doc.read_text() == page
