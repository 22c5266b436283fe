"""`python -m skyserve_lite` is the `sky-lite` command."""

from skyserve_lite.cli.entry import main

if __name__ == "__main__":
    main()
