from trtbuild.cli import run

run()
