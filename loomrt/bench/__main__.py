"""``python -m loomrt.bench``: the same commands as ``loomrt bench``."""

from loomrt.cli.bench_cmd import bench_app

bench_app(prog_name="loomrt bench")
