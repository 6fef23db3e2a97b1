"""``prism deploy origin``: the Prism origin on AWS (EC2 behind Caddy, secrets in SSM, boto3)."""
