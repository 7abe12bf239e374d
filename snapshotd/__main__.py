from snapshotd.cli.commands import main

main(prog_name="snapshotd")
