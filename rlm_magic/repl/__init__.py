"""repl"""
