"""``prism deploy origin``: the Prism origin on AWS (EC2 behind Caddy, secrets in SSM, boto3).

Layers, each importing only those below it:

- ``userdata``: the instance's cloud-init script and Caddyfile (pure text);
  ``health``: the pre-traffic ``/healthz`` check of a new instance.
- ``stack``: one stack's configuration, release reference, result and errors.
- ``access`` (security group, instance role) and ``releases`` (the region's release bucket):
  the steps over one AWS service each; ``instances``: the blue/green instance swap;
  ``balancer`` (the Network Load Balancer and its certificate) and ``fleet`` (launch
  template, Auto Scaling group, instance refresh): a region on ``--instances`` N > 1.
- ``deployer``: one ``apply`` run, the steps in order (secrets, release, address).
- ``origin``: ``plan`` and ``apply``, what ``prism deploy origin`` calls.
"""
