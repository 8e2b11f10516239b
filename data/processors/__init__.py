"""The Model Zoo's data processors, one module per data source; each registered model names its data
function here as a ``module:function`` string."""
