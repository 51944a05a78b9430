# The VPC: a public subnet per AZ (NAT gateways only, nothing of kiln's), a private subnet per AZ
# (every instance and the database), an S3 gateway endpoint so that blobs do not cross the NAT,
# and flow logs of all traffic into CloudWatch Logs.
# The zones named, which must exist and be available: a plan fails rather than spreads elsewhere.
data "aws_availability_zones" "chosen" {
  state = "available"
  filter {
    name   = "zone-name"
    values = var.azs
  }

  lifecycle {
    postcondition {
      condition     = length(self.names) == length(var.azs)
      error_message = "Not every zone of ${join(", ", var.azs)} exists and is available in this region; name others (availability_zones)."
    }
  }
}

locals {
  az_count = length(var.azs)
  # The zones in the order given (the postcondition above saw that every one is available).
  azs = [for z in var.azs : z if contains(data.aws_availability_zones.chosen.names, z)]
  # /20s: public ones first (0..n-1), private ones from 8 on, so the plan stays stable when an
  # AZ is added.
  public_cidrs  = [for i in range(local.az_count) : cidrsubnet(var.cidr, 4, i)]
  private_cidrs = [for i in range(local.az_count) : cidrsubnet(var.cidr, 4, 8 + i)]
  nat_count     = var.single_nat_gateway ? 1 : local.az_count
}

resource "aws_vpc" "this" {
  cidr_block           = var.cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = { Name = var.name }
}

# No rules: nothing may use the default security group.
resource "aws_default_security_group" "this" {
  vpc_id = aws_vpc.this.id
  tags   = { Name = "${var.name}-default-unused" }
}

resource "aws_internet_gateway" "this" {
  vpc_id = aws_vpc.this.id
  tags   = { Name = var.name }
}

resource "aws_subnet" "public" {
  count             = local.az_count
  vpc_id            = aws_vpc.this.id
  availability_zone = local.azs[count.index]
  cidr_block        = local.public_cidrs[count.index]
  # Only NAT gateways live here, and they get Elastic IPs: nothing needs a public address at launch.
  map_public_ip_on_launch = false
  tags                    = { Name = "${var.name}-public-${local.azs[count.index]}" }
}

resource "aws_subnet" "private" {
  count             = local.az_count
  vpc_id            = aws_vpc.this.id
  availability_zone = local.azs[count.index]
  cidr_block        = local.private_cidrs[count.index]
  tags              = { Name = "${var.name}-private-${local.azs[count.index]}" }
}

# The first two /26s of each private subnet are for addresses given explicitly (the nodes of
# the address plan): AWS assigns none of them to Auto Scaling instances, RDS or endpoints. Two
# reservations rather than one /25, so that the first stays as it was when the second was added.
resource "aws_ec2_subnet_cidr_reservation" "static" {
  count            = local.az_count
  subnet_id        = aws_subnet.private[count.index].id
  cidr_block       = cidrsubnet(local.private_cidrs[count.index], 6, 0)
  reservation_type = "explicit"
  description      = "kiln nodes at planned addresses"
}

resource "aws_ec2_subnet_cidr_reservation" "static_second" {
  count            = local.az_count
  subnet_id        = aws_subnet.private[count.index].id
  cidr_block       = cidrsubnet(local.private_cidrs[count.index], 6, 1)
  reservation_type = "explicit"
  description      = "kiln nodes at planned addresses (second block)"
}

resource "aws_eip" "nat" {
  count  = local.nat_count
  domain = "vpc"
  tags   = { Name = "${var.name}-nat-${count.index}" }
}

resource "aws_nat_gateway" "this" {
  count         = local.nat_count
  allocation_id = aws_eip.nat[count.index].id
  subnet_id     = aws_subnet.public[count.index].id
  tags          = { Name = "${var.name}-${local.azs[count.index]}" }
  depends_on    = [aws_internet_gateway.this]
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.this.id
  tags   = { Name = "${var.name}-public" }
}

resource "aws_route" "public_internet" {
  route_table_id         = aws_route_table.public.id
  destination_cidr_block = "0.0.0.0/0"
  gateway_id             = aws_internet_gateway.this.id
}

resource "aws_route_table_association" "public" {
  count          = local.az_count
  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public.id
}

resource "aws_route_table" "private" {
  count  = local.az_count
  vpc_id = aws_vpc.this.id
  tags   = { Name = "${var.name}-private-${local.azs[count.index]}" }
}

resource "aws_route" "private_nat" {
  count                  = local.az_count
  route_table_id         = aws_route_table.private[count.index].id
  destination_cidr_block = "0.0.0.0/0"
  nat_gateway_id         = aws_nat_gateway.this[var.single_nat_gateway ? 0 : count.index].id
}

resource "aws_route_table_association" "private" {
  count          = local.az_count
  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private[count.index].id
}

data "aws_region" "current" {}

# S3 traffic (blobs, releases) stays on AWS's network and costs no NAT processing.
resource "aws_vpc_endpoint" "s3" {
  vpc_id            = aws_vpc.this.id
  service_name      = "com.amazonaws.${data.aws_region.current.name}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = aws_route_table.private[*].id
  tags              = { Name = "${var.name}-s3" }
}
