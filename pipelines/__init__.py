"""tfhash.pipelines"""
