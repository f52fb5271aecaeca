"""entmax_attention: public entry point and backend dispatch. PLACEHOLDER until the foundation lands."""


def entmax_attention(q, k, v, **kwargs):
    raise NotImplementedError
