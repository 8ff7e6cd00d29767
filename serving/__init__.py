"""tfhash.serving"""
