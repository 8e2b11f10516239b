"""Data processors registered by their Model Zoo class names; each module reads the layout the Model Zoo's
own preprocessing writes."""
