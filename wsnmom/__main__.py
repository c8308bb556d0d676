"""Allow ``python -m wsnmom``."""

from wsnmom.cli import main

main()
