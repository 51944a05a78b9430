# A private zone of the VPC: one name per service for all its replicas (jobs reach the api and
# log-ingest by these names; users inside the VPC can too, the CLI's `kiln sweep` the advisor,
# and `kiln serve` and inference clients the predictor, whose REST API advertises its name).
resource "aws_route53_zone" "private" {
  name = var.private_zone

  vpc {
    vpc_id = module.network.vpc_id
  }
}

resource "aws_route53_record" "service" {
  #checkov:skip=CKV2_AWS_23: the records are the planned private addresses of the service instances (modules/node sets them as private_ip), which checkov cannot link
  for_each = {
    api        = local.ips["api"]
    log-ingest = local.ips["log-ingest"]
    item-batch = local.ips["item-batch"]
    advisor    = local.ips["advisor"]
    predictor  = local.ips["predictor"]
    nats       = local.ips["nats"]
  }
  zone_id = aws_route53_zone.private.zone_id
  name    = "${each.key}.${var.private_zone}"
  type    = "A"
  ttl     = 60
  records = each.value
}
