"""Helpers the tests share (no tests here): CLI runners, synthetic profiles and plans, small
random partition problems, figure decoding, and the models and edges several tests use.

Test modules import from here (or take a conftest.py fixture), never from another test module.
"""
