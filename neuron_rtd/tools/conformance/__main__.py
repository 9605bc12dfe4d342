"""`python -m neuron_rtd.tools.conformance`: the command (`cli.main`)."""

import sys

from neuron_rtd.tools.conformance.cli import main

if __name__ == "__main__":
    sys.exit(main())
