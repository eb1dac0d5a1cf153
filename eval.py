#!/usr/bin/env python
"""python eval.py ckpt=DIR|FILE [model=ARCH] [suite=all|NAME,NAME] [key=value ...] out=DIR   (--help: every key)"""
import sys

from negft.commands.eval import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
