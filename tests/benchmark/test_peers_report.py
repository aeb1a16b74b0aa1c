"""bench/peers.py's report: the ratio table and the docs section it rewrites in place."""

from tests.benchmark.bench_helpers import load_bench

peers = load_bench("peers")


def results():
    return [peers.PeerResult("inferplug native", "float32", "0.1.0", 2.0, 200, [10.0, 30.0], [5.0]),
            peers.PeerResult("ctranslate2", "int8", "4.8", 4.0, 200)]


def test_ratio_table_divides_our_throughput_by_each_peers():
    table = peers.ratio_table(results())
    assert "| inferplug native 0.1.0 | float32 | 100.0 | 1.00x | 20.0 | 5.0 |" in table
    assert "| ctranslate2 4.8 | int8 | 50.0 | 2.00x | n/a | n/a |" in table


def test_step_clock_gives_ttft_and_tpot_per_sequence():
    clock = peers.StepClock()
    clock.origin = 0.0
    clock.first, clock.last = {0: 0.5, 1: 1.0}, {0: 1.5, 1: 1.0}
    ttft, tpot = clock.latencies(output_len=3)
    assert ttft == [500.0, 1000.0] and tpot == [500.0, 0.0]


def test_write_docs_replaces_only_the_marked_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nhand-written intro\n\n<!-- peers:start -->\nold table\n<!-- peers:end -->\n\noutro\n")
    info = {"cpu": "Test CPU", "cores": 2, "isa": ["avx2"], "memory_gib": 8, "os": "Linux", "python": "3.11",
            "versions": {"torch": "2.13"}}
    for _ in range(2):  # idempotent: a second run replaces, never appends
        peers.write_docs(doc, "python bench/peers.py", info, "| new table |", {"llama.cpp": "not installed"})
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nhand-written intro") and text.endswith("outro\n")
    assert text.count("| new table |") == 1 and "old table" not in text
    assert "Test CPU, 2 cores" in text and "- llama.cpp skipped: not installed" in text
