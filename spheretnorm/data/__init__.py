"""Data preparation for spheretnorm: tokenisers, dataset preparation and bin readers."""
