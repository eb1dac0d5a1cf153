#!/usr/bin/env python
"""python train.py [recipe=NAME] [key=value ...]   |   deepspeed [--num_gpus N] train.py ...   (--help: every key)"""
import sys

from negft.cli import run_train

if __name__ == "__main__":
    sys.exit(run_train(sys.argv[1:]))
