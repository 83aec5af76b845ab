"""DynamoDB Streams tunnel backend (``dynamodb-streams://``); needs boto3.

- ``codec``: tokens and stream records -> ``Record`` (no SDK);
- ``aws``: the endpoint URI, boto3 clients, AWS error mapping;
- ``checkpoints``: tunnels and pushed checkpoints in a DynamoDB table;
- ``service``: ``DynamoDbStreamsTunnelService``, the ``TunnelService`` itself.

Nothing is imported here: ``connector.tunnel.open_tunnel_service`` imports ``service`` only when
the scheme is used, so ``import connector`` never imports boto3.
"""
