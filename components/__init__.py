"""tfhash.components"""
