from snapshotd.cli.main import main

main(prog_name="snapshotd")
