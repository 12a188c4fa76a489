from areal_console.cli import run

run()
