#!/usr/bin/env python
"""python train.py [recipe=NAME] [key=value ...]   |   deepspeed [--num_gpus N] train.py ...   (--help: every key)"""
import sys

from negft.commands.train import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
