#!/usr/bin/env bash
source "$(dirname "$0")/lib.sh"
echo "repro-embrace: coming" >&2
