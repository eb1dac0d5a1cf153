#!/usr/bin/env python
"""python eval.py ckpt=DIR|FILE [model=ARCH] [suite=all|NAME,NAME] [key=value ...] out=DIR   (--help: every key)"""
import sys

from negft.cli import run_eval

if __name__ == "__main__":
    sys.exit(run_eval(sys.argv[1:]))
