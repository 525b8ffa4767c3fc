"""A local, stateful simulator of GitHub's Actions runner scale set service (see README "Actions service simulator")."""
