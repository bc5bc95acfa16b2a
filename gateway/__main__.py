"""python -m gateway  ==  tandem serve-gateway"""

import sys

from tandem.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve-gateway", *sys.argv[1:]]))
