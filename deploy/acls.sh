#!/bin/sh
# Print the kafka-acls.sh commands for a deltacoord deployment (they are not run).
#
#   deploy/acls.sh --writer-principal User:writer --coordinator-principal User:coord \
#       --topic-prefix deltacoord --transactional-id-prefix deltacoord-coordinator \
#       --bootstrap-servers kafka-1:9093 --command-config admin.properties > grant.sh
#   less grant.sh && sh grant.sh
#
# Writers get WRITE+DESCRIBE on <prefix>.proposals, READ+DESCRIBE on <prefix>.commits
# and READ on their consumer-group prefixes; the coordinator READ on proposals,
# WRITE+READ+DESCRIBE+DESCRIBE_CONFIGS on commits, WRITE on dead letters, its
# consumer groups, and WRITE+DESCRIBE on its transactional-id prefix.
# `--format json` prints the grants as data. All options: deltacoord acls --help
set -eu
exec deltacoord acls "$@"
