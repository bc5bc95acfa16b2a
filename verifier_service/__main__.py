"""python -m verifier_service  ==  tandem serve-verifier"""

import sys

from tandem.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve-verifier", *sys.argv[1:]]))
