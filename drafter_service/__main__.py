"""python -m drafter_service  ==  tandem serve-drafter"""

import sys

from tandem.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve-drafter", *sys.argv[1:]]))
